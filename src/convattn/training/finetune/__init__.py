"""What every fine-tuning task (glue/, squad/) shares; a new task builds on these.

    driver.py      `run_job`: the protocol (every check in the promised order, the seeds, the results) for a
                   task's `FineTuneJob`, which supplies its data, settings and scoring
    recipes.py     `FineTuneRecipe` (a paper's hyperparameters for a task, typed; a task's recipe class may add
                   keys) and the recipe names shipped for each task
    settings.py    `FineTuneSettings` (the Trainer's fields; a task's settings class adds its own) and recipe
                   resolution: defaults < base-size settings < the task's own < the command line
    pretrained.py  the model fine-tuned: its folder and tokenizer checked, the input length its positions allow,
                   the record that keys an output folder's finished runs to it
    optim.py       layer-wise learning-rate decay (`LayerDecayTrainer`, ELECTRA's and ConvBERT's)
    trainer.py     one seed's `TrainingArguments`, the quiet training loop, the run.json that marks it finished
    failures.py    what a failed or stopped job leaves: no partial seed, and nothing in a new folder
"""
