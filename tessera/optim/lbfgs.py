"""L-BFGS (a port of ``torch.optim.LBFGS``, itself after minFunc), with an optional
strong-Wolfe line search.

Scalars such as the directional derivative ``gtd`` stay 0-d tensors, as in PyTorch, so
the iterates are rounded the same way and match PyTorch's.

>>> import tessera
>>> x = tessera.nn.Parameter(tessera.tensor([1.5, -0.5]))
>>> opt = tessera.optim.LBFGS([x], line_search_fn="strong_wolfe")
>>> def closure():
...     opt.zero_grad(); loss = ((x - 1.0) ** 2).sum(); loss.backward(); return loss
>>> _ = opt.step(closure); x.detach()
tensor([1., 1.])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import enable_grad, no_grad
from tessera.optim.optimizer import Optimizer, _check_lr, _to_scalar

__all__ = ["LBFGS"]


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to bounds."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = d2_square.sqrt()
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


class _Bracket:
    """The interval [lo, hi] of step lengths the zoom phase narrows, with f, g, gtd at each
    end (``t``, ``f``, ``g``, ``gtd`` are lists of one or two entries)."""

    def __init__(self, t, f, g, gtd):
        self.t, self.f, self.g, self.gtd = t, f, g, gtd


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                  max_ls=25):
    """A step length satisfying the strong Wolfe conditions: bracketing, then zoom."""
    d_norm = d.abs().max()
    g = g.clone()
    br, done, ls_iter, f_new, g_new, ls_func_evals = _wolfe_bracket(
        obj_func, x, t, d, f, g, gtd, c1, c2, max_ls)
    low_pos, high_pos = (0, 1) if br.f[0] <= br.f[-1] else (1, 0)
    insuf_progress = False
    while not done and ls_iter < max_ls:
        if abs(br.t[1] - br.t[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(br.t[0], br.f[0], br.gtd[0], br.t[1], br.f[1], br.gtd[1])
        t, insuf_progress = _safeguard(t, br.t, insuf_progress)
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= br.f[low_pos]:
            _set_end(br, high_pos, t, f_new, g_new.clone(), gtd_new)
            low_pos, high_pos = (0, 1) if br.f[0] <= br.f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (br.t[high_pos] - br.t[low_pos]) >= 0:
                _set_end(br, high_pos, br.t[low_pos], br.f[low_pos], br.g[low_pos],
                         br.gtd[low_pos])
            _set_end(br, low_pos, t, f_new, g_new.clone(), gtd_new)
    return br.f[low_pos], br.g[low_pos], br.t[low_pos], ls_func_evals


def _set_end(br: _Bracket, pos: int, t, f, g, gtd) -> None:
    br.t[pos], br.f[pos], br.g[pos], br.gtd[pos] = t, f, g, gtd


def _safeguard(t, bracket, insuf_progress):
    """Keep the zoom step away from the bracket ends (minFunc's insufficient progress)."""
    eps = 0.1 * (max(bracket) - min(bracket))
    if min(max(bracket) - t, t - min(bracket)) < eps:
        if insuf_progress or t >= max(bracket) or t <= min(bracket):
            if abs(t - max(bracket)) < abs(t - min(bracket)):
                t = max(bracket) - eps
            else:
                t = min(bracket) + eps
            return t, False
        return t, True
    return t, False


def _wolfe_bracket(obj_func, x, t, d, f, g, gtd, c1, c2, max_ls):
    """Phase one: grow ``t`` until an interval holding a Wolfe point is found."""
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev):
            return (_Bracket([t_prev, t], [f_prev, f_new], [g_prev, g_new.clone()],
                             [gtd_prev, gtd_new]), False, ls_iter, f_new, g_new, ls_func_evals)
        if abs(gtd_new) <= -c2 * gtd:
            return (_Bracket([t], [f_new], [g_new], None), True, ls_iter, f_new, g_new,
                    ls_func_evals)
        if gtd_new >= 0:
            return (_Bracket([t_prev, t], [f_prev, f_new], [g_prev, g_new.clone()],
                             [gtd_prev, gtd_new]), False, ls_iter, f_new, g_new, ls_func_evals)
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                               bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.clone(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
    # max_ls reached; PyTorch leaves bracket_gtd unset here, which the zoom never reads
    # because ls_iter == max_ls ends it at once
    return (_Bracket([0, t], [f, f_new], [g, g_new], None), False, ls_iter, f_new, g_new,
            ls_func_evals)


class LBFGS(Optimizer):
    """``torch.optim.LBFGS``: ``step(closure)`` runs up to ``max_iter`` quasi-Newton
    iterations; ``closure`` clears the gradients, computes the loss, calls ``backward`` and
    returns the loss. One param group only."""

    def __init__(self, params, lr: float | Tensor = 1, max_iter: int = 20,
                 max_eval: int | None = None, tolerance_grad: float = 1e-7,
                 tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        _check_lr(lr)
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                    "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                    "history_size": history_size, "line_search_fn": line_search_fn}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]
        self._numel_cache: int | None = None

    def _numel(self) -> int:
        if self._numel_cache is None:
            self._numel_cache = sum(2 * p.numel() if p.is_complex() else p.numel()
                                    for p in self._params)
        return self._numel_cache

    def _gather_flat_grad(self) -> Tensor:
        from tessera.ops.shape import cat
        views = [p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                 for p in self._params]
        return cat(views, 0)

    def _add_grad(self, step_size, update: Tensor) -> None:
        step_size = float(step_size)  # a 0-d tensor becomes a Scalar in PyTorch too
        offset = 0
        for p in self._params:
            numel = p.numel()
            p.add_(update[offset:offset + numel].view_as(p), alpha=step_size)
            offset += numel
        if offset != self._numel():
            raise AssertionError(f"Expected offset {offset} to equal {self._numel()}")

    def _clone_param(self) -> list[Tensor]:
        return [p.clone() for p in self._params]

    def _set_param(self, params_data) -> None:
        for p, pdata in zip(self._params, params_data):
            p.copy_(pdata)

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(closure())
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    @no_grad()
    def step(self, closure):
        """Run up to ``max_iter`` iterations; returns the loss of the first evaluation."""
        group = self.param_groups[0]
        closure = enable_grad()(closure)
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        loss = float(orig_loss)
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if flat_grad.abs().max() <= group["tolerance_grad"]:
            return orig_loss
        self._iterate(closure, group, state, loss, flat_grad)
        return orig_loss

    def _iterate(self, closure, group, state, loss, flat_grad) -> None:
        lr = _to_scalar(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_change = group["tolerance_change"]
        d, t = state.get("d"), state.get("t")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        current_evals, n_iter = 1, 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            d = self._direction(state, group, flat_grad, prev_flat_grad, d, t)
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            t = (min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr)
            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:
                break
            loss, flat_grad, t, ls_func_evals, opt_cond = self._line_step(
                closure, group, loss, flat_grad, t, d, gtd, current_evals, n_iter)
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break
        state.update(d=d, t=t, prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)

    def _direction(self, state, group, flat_grad, prev_flat_grad, d, t) -> Tensor:
        """The search direction: -H g by the two-loop recursion over the kept history."""
        if state["n_iter"] == 1:
            state.update(old_dirs=[], old_stps=[], ro=[], H_diag=1)
            return flat_grad.neg()
        old_dirs, old_stps, ro = state["old_dirs"], state["old_stps"], state["ro"]
        y = flat_grad.sub(prev_flat_grad)
        s = d.mul(t)
        ys = y.dot(s)
        if ys > 1e-10:
            if len(old_dirs) == group["history_size"]:
                old_dirs.pop(0)
                old_stps.pop(0)
                ro.pop(0)
            old_dirs.append(y)
            old_stps.append(s)
            ro.append(1.0 / ys)
            state["H_diag"] = ys / y.dot(y)
        num_old = len(old_dirs)
        if "al" not in state:
            state["al"] = [None] * group["history_size"]
        al = state["al"]
        q = flat_grad.neg()
        for i in range(num_old - 1, -1, -1):
            al[i] = old_stps[i].dot(q) * ro[i]
            q.add_(old_dirs[i], alpha=-float(al[i]))
        r = q.mul(state["H_diag"])
        for i in range(num_old):
            be_i = old_dirs[i].dot(r) * ro[i]
            r.add_(old_stps[i], alpha=float(al[i] - be_i))
        return r

    def _line_step(self, closure, group, loss, flat_grad, t, d, gtd, current_evals, n_iter):
        """Move along ``d``: by the strong-Wolfe step, or by ``t`` and re-evaluate."""
        line_search_fn = group["line_search_fn"]
        ls_func_evals, opt_cond = 0, False
        if line_search_fn is not None:
            if line_search_fn != "strong_wolfe":
                raise RuntimeError("only 'strong_wolfe' is supported")
            x_init = self._clone_param()

            def obj_func(x, t, d):
                return self._directional_evaluate(closure, x, t, d)
            loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                obj_func, x_init, t, d, loss, flat_grad, gtd,
                max_ls=group["max_eval"] - current_evals)
            self._add_grad(t, d)
            opt_cond = bool(flat_grad.abs().max() <= group["tolerance_grad"])
        else:
            self._add_grad(t, d)
            if n_iter != group["max_iter"]:
                loss = float(closure())
                flat_grad = self._gather_flat_grad()
                opt_cond = bool(flat_grad.abs().max() <= group["tolerance_grad"])
                ls_func_evals = 1
        return loss, flat_grad, t, ls_func_evals, opt_cond
