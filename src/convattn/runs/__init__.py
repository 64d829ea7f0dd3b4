"""What a run folder holds and what state it is in; file layouts only, never options.

    folder.py       any run folder: its one writer (the lock), the checks before anything is written, the
                    options record compared, `seed_dir`
    pretrain.py     a pretraining run's folder: file names, checkpoints, metrics, its data record, `run_state`,
                    removing what it wrote
    checkpoints.py  a pretraining checkpoint read back for --resume: whole or damaged, fitting the model or not,
                    what a callback saved in its trainer state
    finetune.py     a fine-tuning job's folder (glue, squad): what it writes at any depth, when a replacement stands
    plots.py        the folder of figures `convattn plot kernels|attention` writes
    replace.py      --overwrite of any job: the old run kept aside until the new one stands, given back otherwise
"""
