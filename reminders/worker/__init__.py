"""What a worker runs: signal hooks, the batch pipeline, the sync/async bridge and the scan lane."""
