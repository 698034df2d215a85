"""{{ cookiecutter.description }}."""
