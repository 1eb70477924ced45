from stabray.train.loop import TrainConfig, Trainer, pick_device

__all__ = ["TrainConfig", "Trainer", "pick_device"]
