"""What a worker process runs: its signal hooks, the batch pipeline, the sync/async bridge and the scan lane."""
