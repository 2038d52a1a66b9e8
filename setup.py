"""Build the Cython kernels; all metadata lives in pyproject.toml.

Environment: ``PCCL_AIO_NO_EXTENSIONS=1`` skips the extension (the numpy reference is used),
``PCCL_AIO_DEBUG=1`` builds with bounds checks, ``-O0 -g`` and an annotated HTML file.
"""

import os

from setuptools import Extension, setup

NO_EXT = os.environ.get("PCCL_AIO_NO_EXTENSIONS", "") not in ("", "0")
DEBUG = os.environ.get("PCCL_AIO_DEBUG", "") not in ("", "0")


def ext_modules() -> list[Extension]:
    if NO_EXT:
        return []
    from Cython.Build import cythonize

    # -ffp-contract=off: no fused multiply-add, so results match the numpy reference bit for bit.
    flags = ["-O0", "-g"] if DEBUG else ["-O3", "-ffp-contract=off", "-fno-math-errno"]
    ext = Extension("pccl_aio._kernels", ["pccl_aio/_kernels.pyx"], extra_compile_args=flags,
                    include_dirs=["pccl_aio"],
                    depends=["pccl_aio/_kernels_simd.h", "pccl_aio/_kernels_half.pxi",
                             "pccl_aio/_kernels_quant.pxi",
                             "pccl_aio/_kernels_reduce.pxi", "pccl_aio/_kernels_sparse.pxi",
                             "pccl_aio/_kernels_sparse.h"])
    directives = {
        "language_level": 3,
        "boundscheck": DEBUG,
        "wraparound": False,
        "cdivision": True,
        "initializedcheck": DEBUG,
        "embedsignature": True,
    }
    return cythonize([ext], compiler_directives=directives, annotate=DEBUG)


setup(ext_modules=ext_modules())
