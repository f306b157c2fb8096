"""Importers that turn models from other frameworks into graph JSON, a lib and params."""
