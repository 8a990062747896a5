"""Command-line entry points: ``futureq`` (server_main.py) and ``futureq-cli`` (client_main.py)."""
