"""Optimizers and learning-rate schedulers with ``torch.optim``'s names and numerics.

Every optimizer updates parameters in place under ``no_grad`` with tessera's in-place ops
(``add_``, ``addcdiv_``, ...), and keeps its state tensors in ``optimizer.state[p]`` in
PyTorch's layout, so trajectories and state_dicts match PyTorch's. ``Optimizer`` runs the
step and creates each parameter's state; an optimizer's module holds its constructor and its
update rule. ``lr_scheduler`` gathers the schedulers from their private parts.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.Adam([w], lr=0.1)
>>> sched = tessera.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
>>> (w * w).sum().backward(); opt.step(); sched.step(); sched.get_last_lr()
[0.05]
"""
from tessera.optim import lr_scheduler
from tessera.optim.adadelta import Adadelta
from tessera.optim.adagrad import Adagrad
from tessera.optim.adam import Adam
from tessera.optim.adamax import Adamax
from tessera.optim.adamw import AdamW
from tessera.optim.lbfgs import LBFGS
from tessera.optim.nadam import NAdam
from tessera.optim.optimizer import (
    Optimizer,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from tessera.optim.radam import RAdam
from tessera.optim.rmsprop import RMSprop
from tessera.optim.sgd import SGD

__all__ = ["Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "NAdam", "Optimizer",
           "RAdam", "RMSprop", "SGD", "lr_scheduler", "register_optimizer_step_post_hook",
           "register_optimizer_step_pre_hook"]
