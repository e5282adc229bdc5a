//! Scraping replicas' /metrics.
