"""Train a DCGAN with tessera, as in PyTorch's DCGAN tutorial, and save generated digits.

By default it trains on scikit-learn's 1,797 bundled 8x8 digits upscaled to 28x28 (a few
minutes on a laptop CPU); with --data-dir it trains on MNIST's IDX files from that folder.
Each epoch shows a progress bar and the losses; at the end it prints the final
discriminator and generator losses and saves a grid of 64 generated images (from a fixed
noise batch) with ``tessera.utils.save_image``.

    python examples/train_dcgan.py                            # digits -> dcgan_samples.png
    python examples/train_dcgan.py --epochs 40 --out samples.png
    python examples/train_dcgan.py --data-dir path/to/mnist --epochs 1 --limit 12800

On a machine whose cores are busy with other work, OPENBLAS_NUM_THREADS=1 can make this
several times faster (multi-threaded BLAS calls stall when their threads must wait).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import tessera as torch
import tessera.nn.functional as F
from tessera.models.gan import dcgan
from tessera.utils import save_image
from tessera.utils.data import DataLoader, TensorDataset

try:
    from tqdm import tqdm
except ImportError:  # the demo extra installs tqdm; without it, plain iteration
    def tqdm(it, **_):
        return it


def load_images(data_dir: str | None, limit: int | None):
    """All training images as one (N, 1, 28, 28) float tensor in [-1, 1] (Tanh's range)."""
    from tessera.datasets import MNIST, Digits
    if data_dir is None:
        images = Digits(train=None).data                       # (N, 1, 8, 8) in [0, 1]
        images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    else:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"--data-dir {data_dir!r} is not a folder")
        images = MNIST(data_dir, train=True).data.float().unsqueeze(1) / 255.0
    if limit is not None:
        images = images[:limit]
    return images.clamp(0, 1) * 2 - 1


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a DCGAN on handwritten digits and save a "
                                            "PNG grid of generated samples.")
    p.add_argument("--data-dir", help="folder with MNIST's IDX files (default: sklearn digits "
                                      "upscaled to 28x28)")
    p.add_argument("--epochs", type=int, default=None, help="default 25 (digits) / 1 (MNIST)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N images")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-4, help="Adam learning rate (both nets)")
    p.add_argument("--beta1", type=float, default=0.5, help="Adam beta1 (tutorial: 0.5)")
    p.add_argument("--nz", type=int, default=64, help="latent size")
    p.add_argument("--ngf", type=int, default=32, help="generator width")
    p.add_argument("--ndf", type=int, default=32, help="discriminator width")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="dcgan_samples.png", help="PNG grid of generated samples")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 25 if args.data_dir is None else 1
    if args.epochs < 0 or args.batch_size < 1 or args.lr <= 0 or min(args.nz, args.ngf,
                                                                      args.ndf) < 1:
        p.error("--epochs must be non-negative; --batch-size, --nz, --ngf, --ndf positive; "
                "--lr positive")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be positive")
    return args


def train_step(netG, netD, optG, optD, real, nz: int) -> tuple[float, float, float, float]:
    """The tutorial's update: D on real (label 1) and fake (label 0), then G to fool D."""
    b = real.size(0)
    ones, zeros = torch.ones(b), torch.zeros(b)
    netD.zero_grad()
    out_real = netD(real).view(-1)
    err_real = F.binary_cross_entropy(out_real, ones)
    fake = netG(torch.randn(b, nz, 1, 1))
    out_fake = netD(fake.detach()).view(-1)
    err_fake = F.binary_cross_entropy(out_fake, zeros)
    (err_real + err_fake).backward()
    optD.step()
    netG.zero_grad()
    out = netD(fake).view(-1)
    errG = F.binary_cross_entropy(out, ones)
    errG.backward()
    optG.step()
    return (err_real + err_fake).item(), errG.item(), out_real.mean().item(), out.mean().item()


def run(args) -> tuple[float, float]:
    torch.manual_seed(args.seed)
    images = load_images(args.data_dir, args.limit)
    loader = DataLoader(TensorDataset(images), batch_size=args.batch_size, shuffle=True,
                        drop_last=len(images) >= args.batch_size,
                        generator=torch.Generator().manual_seed(args.seed))
    netG, netD = dcgan(nz=args.nz, ngf=args.ngf, ndf=args.ndf, nc=1, image_size=28)
    optD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    fixed_noise = torch.randn(64, args.nz, 1, 1)
    print(f"{len(images)} images of 28x28, {args.epochs} epochs, "
          f"G {sum(p.numel() for p in netG.parameters()):,} / "
          f"D {sum(p.numel() for p in netD.parameters()):,} parameters")
    errD = errG = float("nan")
    t_start = time.perf_counter()
    for epoch in range(args.epochs):
        netG.train()
        netD.train()
        t0, sums, n = time.perf_counter(), [0.0] * 4, 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False)
        for (real,) in bar:
            errD, errG, d_x, d_gz = train_step(netG, netD, optG, optD, real, args.nz)
            sums = [s + v for s, v in zip(sums, (errD, errG, d_x, d_gz))]
            n += 1
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss_D=f"{errD:.3f}", loss_G=f"{errG:.3f}")
        m = [s / max(n, 1) for s in sums]
        print(f"epoch {epoch + 1:3d}  loss_D {m[0]:.4f}  loss_G {m[1]:.4f}  D(x) {m[2]:.3f}  "
              f"D(G(z)) {m[3]:.3f}  ({time.perf_counter() - t0:.1f} s)")
    netG.eval()
    with torch.no_grad():
        samples = netG(fixed_noise)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_image(samples, args.out, nrow=8, normalize=True, value_range=(-1, 1))
    print(f"final loss_D {errD:.4f}  loss_G {errG:.4f} (last batch); "
          f"{time.perf_counter() - t_start:.0f} s; 64 samples saved to {args.out}")
    return errD, errG


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
