"""Thin entry so `python cli.py ...` from a checkout runs the same app as `graphrun`."""
from graph_runtime.cli.app import main

if __name__ == "__main__":
    main()
