//! `helm template` through real Helm: prints the chart's CRDs and documents as Helm
//! prints them (and its notes with `--notes`).
//!
//! ```sh
//! cargo run -p ballast-helm --example template -- charts/ballast \
//!     [--name ballast] [--namespace ballast-system] [-f values.yaml] \
//!     [--api-versions monitoring.coreos.com/v1/ServiceMonitor]... [--kube-version v1.28.0] [--notes]
//! ```

use std::process::ExitCode;

use ballast_helm::{Helm, RenderOptions};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let (mut name, mut namespace) = ("ballast".to_string(), "default".to_string());
    let mut values = String::new();
    let mut options = RenderOptions::default();
    let mut notes = false;
    while let Some(a) = args.next() {
        let mut value = |flag: &str| {
            args.next().ok_or_else(|| {
                eprintln!("{flag} needs a value");
                ExitCode::from(2)
            })
        };
        let taken = match a.as_str() {
            "--name" => value("--name").map(|v| name = v),
            "--namespace" | "-n" => value("--namespace").map(|v| namespace = v),
            "--api-versions" | "-a" => {
                value("--api-versions").map(|v| options.api_versions.push(v))
            }
            "--kube-version" => value("--kube-version").map(|v| options.kube_version = Some(v)),
            "--notes" => {
                notes = true;
                Ok(())
            }
            "-f" | "--values" => value("--values").and_then(|path| {
                std::fs::read_to_string(&path)
                    .map(|text| values = text)
                    .map_err(|e| {
                        eprintln!("{path}: {e}");
                        ExitCode::from(2)
                    })
            }),
            _ if dir.is_none() && !a.starts_with('-') => {
                dir = Some(a);
                Ok(())
            }
            _ => {
                eprintln!("unknown argument {a}");
                Err(ExitCode::from(2))
            }
        };
        if let Err(code) = taken {
            return code;
        }
    }
    let dir = dir.unwrap_or_else(|| "charts/ballast".into());
    let rendered =
        Helm::new().and_then(|helm| helm.render_with(&dir, &name, &namespace, &values, &options));
    match rendered {
        Ok(r) => {
            print!("{r}");
            if notes {
                println!("\nNOTES:\n{}", r.notes);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}
