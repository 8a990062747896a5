"""RocksDB storage through rocksdict: column families, write batches, synced writes."""
