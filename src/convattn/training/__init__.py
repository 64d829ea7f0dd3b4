"""Training: pretraining (`pretrain`) with named recipes (`recipes`), and fine-tuning."""
