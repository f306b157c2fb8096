"""The importer's pattern rewrites (run in frontend/passes.py's order) and FuseOps (fuse_ops.py)."""
