//! The command line an InferenceService implies for its engine, in each engine's own flags:
//! `ballast engine`, vLLM's OpenAI server, SGLang's `launch_server`. One copy for both
//! runtimes: `ballast local` starts processes with it, the controller puts it in pods.

use ballast_crds::{EngineKind, InferenceService};

/// Where the engine listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen<'a> {
    /// `--host`: `127.0.0.1` locally, `$(POD_IP)` in a pod (expanded by the kubelet from
    /// the downward API).
    pub host: &'a str,
    /// The HTTP port (0: any free port, announced on stdout; `ballast` only).
    pub port: i32,
    /// The control API port (0: off; `ballast` only).
    pub grpc_port: i32,
}

/// A container's command (`None`: the image's entrypoint) and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCommand {
    /// The executable and leading words, when the image's entrypoint is not the server.
    pub command: Option<Vec<String>>,
    /// Flags, then `spec.engine.args`.
    pub args: Vec<String>,
}

/// The command of `isvc`'s engine kind.
pub fn command(isvc: &InferenceService, listen: Listen<'_>) -> EngineCommand {
    match isvc.spec.engine.kind {
        EngineKind::Ballast => EngineCommand {
            command: Some(vec!["ballast".into()]),
            args: ballast(isvc, listen),
        },
        // The vllm/vllm-openai image's entrypoint is the OpenAI server.
        EngineKind::Vllm => EngineCommand {
            command: None,
            args: vllm(isvc, listen),
        },
        // SGLang's images have no server entrypoint.
        EngineKind::Sglang => EngineCommand {
            command: Some(vec![
                "python3".into(),
                "-m".into(),
                "sglang.launch_server".into(),
            ]),
            args: sglang(isvc, listen),
        },
    }
}

fn flag(a: &mut Vec<String>, name: &str, value: impl ToString) {
    a.push(name.to_string());
    a.push(value.to_string());
}

/// `ballast engine …`: every engine field maps to a flag.
pub fn ballast(isvc: &InferenceService, listen: Listen<'_>) -> Vec<String> {
    let e = &isvc.spec.engine;
    let mut a = vec!["engine".to_string()];
    flag(&mut a, "--host", listen.host);
    flag(&mut a, "--port", listen.port);
    flag(&mut a, "--grpc-port", listen.grpc_port);
    flag(&mut a, "--model", &isvc.spec.model.source);
    flag(&mut a, "--served-model-name", isvc.served_name());
    flag(&mut a, "--data-parallel-size", e.data_parallel_size);
    flag(&mut a, "--max-num-seqs", e.max_num_seqs);
    flag(&mut a, "--max-num-batched-tokens", e.max_num_batched_tokens);
    flag(&mut a, "--max-queued-requests", e.max_queued_requests);
    flag(&mut a, "--max-queued-tokens", e.max_queued_tokens);
    flag(&mut a, "--block-size", e.kv_cache.block_size);
    if let Some(n) = e.max_running_per_tenant {
        flag(&mut a, "--max-running-per-tenant", n);
    }
    if let Some(n) = e.kv_cache.num_blocks {
        flag(&mut a, "--num-kv-blocks", n);
    }
    if !e.enable_prefix_caching {
        a.push("--no-enable-prefix-caching".into());
    }
    a.extend(e.args.iter().cloned());
    a
}

/// vLLM's OpenAI server. vLLM has no admission queue limits, tenant caps or control API:
/// those fields have no flag (its metrics still give waiting, KV usage and TTFT).
pub fn vllm(isvc: &InferenceService, listen: Listen<'_>) -> Vec<String> {
    let e = &isvc.spec.engine;
    let mut a = Vec::new();
    flag(&mut a, "--model", &isvc.spec.model.source);
    flag(&mut a, "--served-model-name", isvc.served_name());
    flag(&mut a, "--host", listen.host);
    flag(&mut a, "--port", listen.port);
    flag(&mut a, "--data-parallel-size", e.data_parallel_size);
    flag(&mut a, "--max-num-seqs", e.max_num_seqs);
    flag(&mut a, "--max-num-batched-tokens", e.max_num_batched_tokens);
    flag(&mut a, "--block-size", e.kv_cache.block_size);
    if let Some(n) = e.kv_cache.num_blocks {
        flag(&mut a, "--num-gpu-blocks-override", n);
    }
    a.push(
        if e.enable_prefix_caching {
            "--enable-prefix-caching"
        } else {
            "--no-enable-prefix-caching"
        }
        .into(),
    );
    a.extend(e.args.iter().cloned());
    a
}

/// SGLang's `launch_server`, with `--enable-metrics` (SGLang serves no metrics without it).
pub fn sglang(isvc: &InferenceService, listen: Listen<'_>) -> Vec<String> {
    let e = &isvc.spec.engine;
    let mut a = Vec::new();
    flag(&mut a, "--model-path", &isvc.spec.model.source);
    flag(&mut a, "--served-model-name", isvc.served_name());
    flag(&mut a, "--host", listen.host);
    flag(&mut a, "--port", listen.port);
    flag(&mut a, "--dp-size", e.data_parallel_size);
    flag(&mut a, "--max-running-requests", e.max_num_seqs);
    flag(&mut a, "--chunked-prefill-size", e.max_num_batched_tokens);
    flag(&mut a, "--page-size", e.kv_cache.block_size);
    a.push("--enable-metrics".into());
    if !e.enable_prefix_caching {
        a.push("--disable-radix-cache".into());
    }
    a.extend(e.args.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isvc(yaml: &str) -> InferenceService {
        ballast_crds::parse_yaml(yaml).unwrap().remove(0)
    }

    const BASE: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {source: "synthetic:tiny"}
  engine: {ENGINE}
"#;

    fn with(engine: &str) -> InferenceService {
        isvc(&BASE.replace("{ENGINE}", engine))
    }

    fn value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].as_str())
    }

    const POD: Listen<'static> = Listen {
        host: "$(POD_IP)",
        port: 8000,
        grpc_port: 9000,
    };

    #[test]
    fn ballast_gets_every_field_as_a_flag() {
        let i = with(
            "{maxNumSeqs: 7, maxRunningPerTenant: 2, kvCache: {numBlocks: 99, blockSize: 32}, enablePrefixCaching: false, args: [--seed, '5']}",
        );
        let c = command(&i, POD);
        assert_eq!(c.command, Some(vec!["ballast".to_string()]));
        let a = &c.args;
        assert_eq!(a[0], "engine");
        for (flag, want) in [
            ("--host", "$(POD_IP)"),
            ("--port", "8000"),
            ("--grpc-port", "9000"),
            ("--model", "synthetic:tiny"),
            ("--served-model-name", "chat"),
            ("--max-num-seqs", "7"),
            ("--max-running-per-tenant", "2"),
            ("--num-kv-blocks", "99"),
            ("--block-size", "32"),
            ("--max-queued-requests", "1024"),
        ] {
            assert_eq!(value(a, flag), Some(want), "{flag}");
        }
        assert!(a.contains(&"--no-enable-prefix-caching".to_string()));
        assert_eq!(&a[a.len() - 2..], ["--seed", "5"], "extra args last");
        assert_eq!(value(&ballast(&with("{}"), POD), "--num-kv-blocks"), None);
    }

    #[test]
    fn vllm_and_sglang_get_their_own_flags() {
        let v = command(&with("{kind: vllm, dataParallelSize: 2}"), POD);
        assert_eq!(v.command, None, "the image's entrypoint");
        assert_eq!(value(&v.args, "--data-parallel-size"), Some("2"));
        assert!(v.args.contains(&"--enable-prefix-caching".to_string()));
        assert_eq!(
            value(&v.args, "--grpc-port"),
            None,
            "vLLM has no control API"
        );
        let s = command(
            &with("{kind: sglang, dataParallelSize: 2, enablePrefixCaching: false}"),
            POD,
        );
        assert_eq!(
            s.command.as_deref().map(|c| c.join(" ")),
            Some("python3 -m sglang.launch_server".into())
        );
        assert_eq!(value(&s.args, "--model-path"), Some("synthetic:tiny"));
        assert_eq!(value(&s.args, "--dp-size"), Some("2"));
        assert!(s.args.contains(&"--enable-metrics".to_string()));
        assert!(s.args.contains(&"--disable-radix-cache".to_string()));
    }
}
