"""What a run folder holds and what state it is in; file layouts only, never options.

    folder.py    any run folder: its one writer (the lock), the checks before anything is written, the options
                 record compared, `seed_dir`
    pretrain.py  a pretraining run's folder: file names, checkpoints, metrics, `run_state`, removing what it wrote
"""
