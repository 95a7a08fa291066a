"""Functions the multiprocessing tests run in child processes (importable by name, as the
``spawn`` start method needs)."""
from __future__ import annotations


def add_to(t, value: float) -> None:
    t.add_(value)


def add_from_queue(q, value: float) -> None:
    t = q.get()
    t.add_(value)


def add_to_params(model, value: float) -> None:
    import tessera
    with tessera.no_grad():
        for p in model.parameters():
            p.add_(value)


def spawn_add(rank: int, t) -> None:
    t[rank] += rank + 1


def hogwild_train(rank: int, model, steps: int) -> None:
    """PyTorch's examples/mnist_hogwild train loop, on a tiny regression."""
    import tessera
    tessera.manual_seed(rank)
    opt = tessera.optim.SGD(model.parameters(), lr=0.05)
    x = tessera.randn(64, 4)
    y = x.sum(1, keepdim=True)
    for _ in range(steps):
        opt.zero_grad()
        loss = tessera.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()


def raise_in_child(rank: int) -> None:
    raise ValueError(f"boom in {rank}")
