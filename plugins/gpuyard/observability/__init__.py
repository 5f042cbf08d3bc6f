"""What operators watch: the logging set-up of every server process, and the probe and metrics
server of the processes that serve no HTTP API of their own (scheduler, relay)."""
