"""CPU kernels on oneDNN (binding.py owns the library; one file per op family)."""
