//! ballast-operator's integration tests, one binary: a module per subject, the decide
//! builders shared as `decide_support`.

mod decide_exported;
mod decide_hpa_docs;
mod decide_props;
mod decide_rebalance;
mod decide_scaling;
mod decide_support;
mod keda;
mod reconcile_mock;
mod scrape_aggregate;
mod scrape_fixtures;
mod scrape_http;
mod scrape_malformed;
