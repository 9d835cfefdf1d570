"""``python -m llds_retriever --index DIR --port 8000``: serve the retriever (same flags as ``llds retriever serve``)."""

import sys

from llds_retriever.cli import serve_main

if __name__ == "__main__":
    raise SystemExit(serve_main(sys.argv[1:]))
