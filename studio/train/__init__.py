"""Training: a general loop (studio.train.loop) used by the embedded model and fine-tuning."""
