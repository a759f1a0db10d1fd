"""The training loop library: optimizer and LR schedule, global-norm clipping, one train step under any
layout, metrics, and the full run used by ``examples/train.py``."""
from npudist.train.grad import clip_grad_norm_, global_grad_norm
from npudist.loss import cross_entropy_loss
from npudist.train.optim import build_lr_scheduler, build_optimizer, lr_factor
from npudist.train.seed import set_seed
from npudist.train.step import NonFiniteLossError, train_step

__all__ = ["NonFiniteLossError", "build_lr_scheduler", "build_optimizer", "clip_grad_norm_",
           "cross_entropy_loss", "global_grad_norm", "lr_factor", "set_seed", "train_step"]
