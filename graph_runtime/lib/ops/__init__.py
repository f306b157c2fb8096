"""Standard op families; each module defines its ops and their kernels per backend."""
