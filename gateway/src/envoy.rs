//! The Envoy bootstraps of `deploy/envoy/`, filled in: `gateway.yaml` for a standalone pool
//! of fixed addresses (what the tests and the gateway benchmark start Envoy with), and
//! `inference-pool.yaml` for an InferencePool in Kubernetes, whose pods Envoy never lists.

use std::net::SocketAddr;

/// The checked-in bootstrap, with its `${...}` placeholders.
pub const TEMPLATE: &str = include_str!("../../deploy/envoy/gateway.yaml");

/// The anchor: Envoy round robin over the same pool, no gateway (its placeholders are a
/// subset of [`TEMPLATE`]'s).
pub const ROUND_ROBIN: &str = include_str!("../../deploy/envoy/round-robin.yaml");

/// Envoy in front of an InferencePool's picker Service: each request goes to the pod the
/// picker names (an `ORIGINAL_DST` cluster on `x-gateway-destination-endpoint`), so pods
/// may come and go; it has no engine lines ([`Bootstrap::engines`] may be empty).
pub const INFERENCE_POOL: &str = include_str!("../../deploy/envoy/inference-pool.yaml");

/// What the bootstrap's placeholders stand for.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// Where Envoy listens for OpenAI requests.
    pub listen: SocketAddr,
    /// Envoy's admin port (on 127.0.0.1).
    pub admin_port: u16,
    /// The gateway's gRPC address.
    pub gateway: SocketAddr,
    /// FailOpen (`true`): requests go on, round robin, when the gateway cannot be reached;
    /// FailClose (`false`, the InferencePool default): they fail.
    pub fail_open: bool,
    /// The engines: the pool's endpoints.
    pub engines: Vec<SocketAddr>,
}

impl Bootstrap {
    /// `template` with every placeholder filled in: the line that names an engine is
    /// repeated once per engine. A placeholder left over is an error naming it, and so is
    /// a template with an engine line but no engine.
    pub fn render(&self, template: &str) -> Result<String, String> {
        if self.engines.is_empty() && template.contains("${ENGINE_ADDRESS}") {
            return Err("the pool needs at least one engine".into());
        }
        let ip = |a: &SocketAddr| a.ip().to_string();
        let mut out = String::with_capacity(template.len() + 128 * self.engines.len());
        for line in template.lines() {
            if line.contains("${ENGINE_ADDRESS}") {
                for e in &self.engines {
                    out.push_str(
                        &line
                            .replace("${ENGINE_ADDRESS}", &ip(e))
                            .replace("${ENGINE_PORT}", &e.port().to_string()),
                    );
                    out.push('\n');
                }
                continue;
            }
            let line = line
                .replace("${ADMIN_PORT}", &self.admin_port.to_string())
                .replace("${LISTEN_ADDRESS}", &ip(&self.listen))
                .replace("${LISTEN_PORT}", &self.listen.port().to_string())
                .replace("${GATEWAY_ADDRESS}", &ip(&self.gateway))
                .replace("${GATEWAY_PORT}", &self.gateway.port().to_string())
                .replace("${FAILURE_MODE_ALLOW}", &self.fail_open.to_string());
            // Comments may mention placeholders; values may not keep one.
            let value = line.split('#').next().unwrap_or("");
            if let Some(at) = value.find("${") {
                let name: String = value[at..].chars().take_while(|&c| c != '}').collect();
                return Err(format!("the bootstrap has an unknown placeholder {name}}}"));
            }
            out.push_str(&line);
            out.push('\n');
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrap() -> Bootstrap {
        Bootstrap {
            listen: "127.0.0.1:10000".parse().unwrap(),
            admin_port: 10001,
            gateway: "127.0.0.1:9002".parse().unwrap(),
            fail_open: false,
            engines: vec![
                "127.0.0.1:8001".parse().unwrap(),
                "10.0.0.2:8000".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn every_placeholder_of_the_checked_in_bootstrap_is_filled() {
        let yaml = bootstrap().render(TEMPLATE).unwrap();
        let values: String = yaml
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .collect();
        assert!(!values.contains("${"), "{yaml}");
        assert!(yaml.contains("port_value: 8001"));
        assert!(yaml.contains("address: 10.0.0.2, port_value: 8000"));
        assert!(yaml.contains("failure_mode_allow: false"));
        assert!(yaml.contains("port_value: 9002"));
        let rr = bootstrap().render(ROUND_ROBIN).unwrap();
        assert!(rr.contains("address: 10.0.0.2, port_value: 8000"), "{rr}");
        assert!(!rr.contains("ext_proc") && rr.contains("ROUND_ROBIN"));
    }

    #[test]
    fn an_unknown_placeholder_or_no_engine_is_an_error() {
        let e = bootstrap().render("a: ${NOPE}\n").unwrap_err();
        assert!(e.contains("${NOPE}"), "{e}");
        let none = Bootstrap {
            engines: vec![],
            ..bootstrap()
        };
        assert!(none.render(TEMPLATE).is_err());
    }

    #[test]
    fn the_inference_pool_bootstrap_needs_no_engine_list() {
        let picker = Bootstrap {
            gateway: "10.96.0.40:9002".parse().unwrap(),
            engines: vec![],
            ..bootstrap()
        };
        let yaml = picker.render(INFERENCE_POOL).unwrap();
        assert!(
            yaml.contains("address: 10.96.0.40, port_value: 9002"),
            "{yaml}"
        );
        assert!(yaml.contains("type: ORIGINAL_DST"));
        assert!(yaml.contains("http_header_name: x-gateway-destination-endpoint"));
        assert!(yaml.contains("failure_mode_allow: false"));
    }
}
