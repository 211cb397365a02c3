"""Training: `genolc finetune` (loop), schedules, checkpoints with exact resume, memory plan, model transforms."""
