import pytest


@pytest.fixture
def drawn(monkeypatch):
    """drawn(module): the list of figures `module` saves from then on, kept to be read instead of written."""

    def capture(module) -> list:
        figures = []
        monkeypatch.setattr(module, "save_figure", lambda fig, path: figures.append(fig) or path)
        return figures

    return capture
