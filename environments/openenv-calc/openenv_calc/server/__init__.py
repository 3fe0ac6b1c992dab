"""The openenv-calc server: the environment (environment.py) and its app (app.py)."""
