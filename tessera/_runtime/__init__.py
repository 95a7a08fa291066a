"""Process-wide runtime settings, the bottom layer: imports nothing else of tessera.

* ``blas_env``: OpenBLAS's idle-thread timeout, set before NumPy loads it;
* ``malloc``: glibc's allocator tuned to keep freed memory for the next step;
* ``threads``: ``set_num_threads`` / ``get_num_threads``.
"""
