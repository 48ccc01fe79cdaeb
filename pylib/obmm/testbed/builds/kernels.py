"""The guest kernel's providers: which kernel the nodes boot, and so the tree their modules build
against (``Image.kdir``; None: Debian's headers for the image's release, ``image.kernel_tree``).

One protocol, one table: the kernel setting (``OBMM_TESTBED_KERNEL``, ``--kernel``) names a
provider here (``debian``, ``debug``, or an absolute path: a built kernel tree), and
:func:`guest_image` is the image with that provider's kernel.  A new provider is a module of
its own under ``builds/`` (how the kernel is got and cached, like
:mod:`obmm.testbed.builds.debugkernel`), a class here and its name in ``envvars.KERNEL_NAMES``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from obmm.testbed.arch import X86_64
from obmm.testbed.builds import kerneltree
from obmm.testbed.builds.image import (
    Image,
    ImageError,
    Recipe,
    debug_variant,
    ensure_image,
    kernel_variant,
)
from obmm.testbed.progress import Progress

KERNEL_DEBIAN = "debian"
KERNEL_DEBUG = "debug"


class KernelProvider(Protocol):
    #: The setting's value that picks it.
    name: str

    def boots(self, image: Image) -> Image:
        """`image`, booting this provider's kernel (the same disk)."""
        ...


class DebianKernel:
    """The image's own: Debian's kernel of the recipe's release."""

    name = KERNEL_DEBIAN

    def boots(self, image: Image) -> Image:
        return image


class DebugKernel:
    """Our build of Debian's kernel with KASAN, lockdep and kmemleak (`make debug-kernel`)."""

    name = KERNEL_DEBUG

    def boots(self, image: Image) -> Image:
        if image.arch.name != X86_64.name:
            raise ImageError(f"the debug kernel is built for x86_64 only, not {image.arch.name}")
        return debug_variant(image)


class TreeKernel:
    """A built kernel tree given by path (:mod:`obmm.testbed.builds.kerneltree`)."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.path = path

    def boots(self, image: Image) -> Image:
        return kernel_variant(image, kerneltree.load(self.path, image.arch))


PROVIDERS: dict[str, KernelProvider] = {p.name: p for p in (DebianKernel(), DebugKernel())}


def provider(name: str) -> KernelProvider:
    if Path(name).is_absolute():
        return TreeKernel(Path(name))
    try:
        return PROVIDERS[name]
    except KeyError:
        expected = " or ".join(PROVIDERS)
        raise ImageError(
            f"kernel {name!r}: expected {expected}, or a kernel tree's absolute path"
        ) from None


def guest_image(
    recipe: Recipe | None = None,
    *,
    kernel: str = KERNEL_DEBIAN,
    arch: str = X86_64.name,
    rebuild: bool = False,
    progress: Progress | None = None,
) -> Image:
    """The cached image for `recipe` and `arch` (built first if need be), booting the kernel
    of the provider named `kernel`."""
    chosen = provider(kernel)  # an unknown name fails before any build
    return chosen.boots(ensure_image(recipe, rebuild=rebuild, progress=progress, arch=arch))
