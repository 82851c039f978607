"""The web UI the api pods serve: the built bundle (or a `--path` folder) and its defaults."""
