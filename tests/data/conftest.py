import logging

import pytest


@pytest.fixture
def cache_log(caplog):
    """`caplog` for the cache's messages, also after a command has captured the convattn loggers for log.txt
    (which stops them propagating to the root logger that caplog listens on)."""
    logger = logging.getLogger("convattn.data.cache")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="convattn.data.cache")
    yield caplog
    logger.removeHandler(caplog.handler)
