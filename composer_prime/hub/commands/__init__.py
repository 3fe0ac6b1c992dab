"""One module per `composer-prime env` command."""
