//! `helm template` without Helm: prints the chart's CRDs and documents as Helm prints them.
//!
//! ```sh
//! cargo run -p ballast-chart --example template -- charts/ballast \
//!     [--name ballast] [--namespace ballast-system] [-f values.yaml]... \
//!     [--api-versions monitoring.coreos.com/v1]... [--notes]
//! ```

use std::process::ExitCode;

use ballast_chart::{Chart, RenderOptions, Value, merge_values};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut options = RenderOptions::new("ballast", "default");
    let mut values = Value::Nil;
    let mut notes = false;
    while let Some(a) = args.next() {
        let mut value = |flag: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("{flag} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--name" => options.release_name = value("--name"),
            "--namespace" | "-n" => options.namespace = value("--namespace"),
            "--api-versions" | "-a" => options.api_versions.push(value("--api-versions")),
            "--notes" => notes = true,
            "-f" | "--values" => {
                let path = value("--values");
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("{path}: {e}");
                        return ExitCode::from(2);
                    }
                };
                match Value::from_yaml(&text) {
                    Ok(v) => merge_values(&mut values, v),
                    Err(e) => {
                        eprintln!("{path}: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            _ if dir.is_none() && !a.starts_with('-') => dir = Some(a),
            _ => {
                eprintln!("unknown argument {a}");
                return ExitCode::from(2);
            }
        }
    }
    options.values_override = values;
    let chart = match Chart::load(dir.as_deref().unwrap_or("charts/ballast")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(1);
        }
    };
    match chart.render(&options) {
        Ok(out) => {
            for d in out.crds.iter().chain(&out.documents) {
                print!(
                    "---\n# Source: {}/{}\n{}",
                    chart.name(),
                    d.source,
                    d.content
                );
            }
            if notes {
                print!("\nNOTES:\n{}\n", out.notes);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}
