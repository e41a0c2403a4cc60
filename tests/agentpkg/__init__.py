"""A user's agents package, as `--agents` loads it (tests/test_agents_loading.py): a tool built
from a JSON Schema and a callable, a scripted model, and a function that returns the directory."""
