//! Prints a GGUF file's metadata, tensor directory and what Ballast reads from it.
//!
//! ```text
//! cargo run -p ballast-engine --example gguf_info -- PATH.gguf [--all-tensors] [--stats]
//! ```
//!
//! `--stats` dequantizes every tensor and prints its element count, sum, sum of absolute
//! values and non-finite count, one tab-separated line per tensor, so another GGUF reader's
//! dequantization can be compared with Ballast's.

use std::collections::BTreeMap;
use std::process::ExitCode;

use ballast_engine::compute::model::gguf::{GgufFile, MetaValue};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all_tensors = args.iter().any(|a| a == "--all-tensors");
    let stats = args.iter().any(|a| a == "--stats");
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: gguf_info PATH.gguf [--all-tensors] [--stats]");
        return ExitCode::from(2);
    };
    let result = if stats {
        print_stats(path)
    } else {
        run(path, all_tensors)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gguf_info: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &str, all_tensors: bool) -> Result<(), Box<dyn std::error::Error>> {
    let file = GgufFile::open(path.as_ref())?;
    let h = file.header();
    println!("file:        {path}");
    println!("size:        {} bytes", file.len());
    println!(
        "gguf:        version {}, alignment {}, data at byte {}",
        h.version, h.alignment, h.data_offset
    );

    println!("\nmetadata ({} keys):", file.metadata().len());
    for (key, value) in file.metadata().iter() {
        let shown = match (key, value) {
            // Templates are long and multi-line: show their size, not their text.
            ("tokenizer.chat_template", MetaValue::String(s)) => {
                format!("<{} bytes of Jinja>", s.len())
            }
            _ => value.to_string(),
        };
        println!("  {key:<44} {:<14} {shown}", value.type_description());
    }

    println!("\ntensors ({}):", file.tensors().len());
    let mut by_type: BTreeMap<_, (usize, u64)> = BTreeMap::new();
    let mut total_bytes = 0u64;
    for (i, t) in file.tensors().iter().enumerate() {
        let entry = by_type.entry(t.dtype).or_default();
        entry.0 += 1;
        entry.1 += t.n_bytes;
        total_bytes += t.n_bytes;
        // Layers repeat; by default show the tensors outside blocks and those of block 0.
        if all_tensors || !t.name.starts_with("blk.") || t.name.starts_with("blk.0.") {
            println!(
                "  {i:>4} {:<28} {:<6} {:<18} {:>12} bytes",
                t.name,
                t.dtype.name(),
                format!("{:?}", t.dims),
                t.n_bytes
            );
        }
    }
    if !all_tensors {
        println!("  (blocks 1.. have the same tensors as block 0; --all-tensors lists them)");
    }
    println!("\ntensor types:");
    for (dtype, (count, bytes)) in &by_type {
        println!("  {:<6} {count:>4} tensors {bytes:>12} bytes", dtype.name());
    }
    println!(
        "  total  {:>4} tensors {total_bytes:>12} bytes",
        file.tensors().len()
    );

    println!("\nllama spec:");
    match file.llama_spec() {
        Ok(spec) => println!("  {}", format!("{spec:#?}").replace('\n', "\n  ")),
        Err(e) => println!("  not readable: {e}"),
    }
    // Tied embeddings: no separate output head, the embedding table doubles as it.
    println!(
        "  output head: {}",
        if file.header().tensor_info("output.weight").is_some() {
            "output.weight"
        } else {
            "tied to token_embd.weight"
        }
    );

    println!("\ntokenizer:");
    match file.tokenizer_metadata() {
        Ok(tok) => {
            println!("  model:         {}", tok.model);
            println!("  pre-tokenizer: {}", tok.pre.unwrap_or("-"));
            println!("  tokens:        {}", tok.tokens.len());
            println!("  merges:        {}", tok.merges.map_or(0, <[_]>::len));
            let name = |id: Option<u32>| {
                id.map_or("-".to_string(), |id| {
                    format!("{id} {:?}", tok.tokens[id as usize])
                })
            };
            println!("  bos:           {}", name(tok.bos_token_id));
            println!("  eos:           {}", name(tok.eos_token_id));
            match tok.chat_template {
                Some(t) => println!("  chat template: present, {} bytes:\n{t}", t.len()),
                None => println!("  chat template: absent"),
            }
        }
        Err(e) => println!("  not readable: {e}"),
    }
    Ok(())
}

fn print_stats(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let file = GgufFile::open(path.as_ref())?;
    for view in file.tensor_views() {
        let values = view.dequantize()?;
        let (mut sum, mut abs_sum, mut non_finite) = (0f64, 0f64, 0usize);
        for &v in &values {
            if v.is_finite() {
                sum += f64::from(v);
                abs_sum += f64::from(v.abs());
            } else {
                non_finite += 1;
            }
        }
        println!(
            "{}\t{}\t{sum:.6e}\t{abs_sum:.6e}\t{non_finite}",
            view.info.name,
            values.len()
        );
    }
    Ok(())
}
