//! The project's image: the `ballast` binary under test built into the Dockerfile's
//! `prebuilt` target with buildah, on the runtime base `ballast_e2e::image` assembles from
//! Debian packages (no registry is reachable here), then checked as a user would meet it:
//! its configuration (user 65532, entrypoint, OCI labels), its root filesystem (no shell,
//! no other program, a stripped binary owned by root) and the binary running from it as
//! uid 65532. The bad inputs — no binary in the context, a base that is not there, is
//! empty or cannot run the binary — must fail saying which.
//!
//! Skips (saying why) without buildah, mmdebstrap, strip or root; `BALLAST_REQUIRE_E2E=1`
//! makes that a failure. The first run makes the base (about a minute, with a Debian
//! mirror); later runs take seconds.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ballast_e2e::image;
use ballast_e2e::process::run;

/// The tag of the image under test; removed at the end.
const TAG: &str = "localhost/ballast:image-test";

fn ballast() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ballast"))
}

/// Whether the image can be built here; panics instead of skipping under
/// `BALLAST_REQUIRE_E2E`.
fn can_build() -> bool {
    match image::tools() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_E2E").is_none(),
                "BALLAST_REQUIRE_E2E is set but the image cannot be built: {why}"
            );
            eprintln!("skipping the image test: {why}");
            false
        }
    }
}

/// A fresh directory under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("ballast-image-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A working container of an image, mounted; unmounted and removed when dropped.
struct Mounted {
    container: String,
    root: PathBuf,
}

impl Mounted {
    fn new(reference: &str) -> Mounted {
        let container =
            run(Command::new("buildah").args(["from", "--pull=never", "-q", reference]))
                .unwrap()
                .trim()
                .to_string();
        let root = run(Command::new("buildah").args(["mount", &container]))
            .unwrap()
            .trim()
            .into();
        Mounted { container, root }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run(Command::new("buildah").args(["umount", &self.container]));
        let _ = run(Command::new("buildah").args(["rm", &self.container]));
    }
}

/// Section names of an ELF file, from `readelf -S` (binutils, as `strip` is).
fn sections(file: &Path) -> Vec<String> {
    run(Command::new("readelf").arg("-SW").arg(file))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.starts_with('[')
                .then(|| {
                    l.split_once(']')?
                        .1
                        .split_whitespace()
                        .next()
                        .map(str::to_string)
                })
                .flatten()
        })
        .collect()
}

/// The Dockerfile's own promises, read from its text: checked everywhere, buildah or not.
#[test]
fn dockerfile_stages_and_defaults() {
    let _group = crate::common::group(module_path!());
    let text = std::fs::read_to_string(image::dockerfile()).unwrap();
    let arg = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .unwrap_or_else(|| panic!("the Dockerfile has no default for ARG {name}"))
            .trim()
            .to_string()
    };
    // The version label's default is the workspace's version (as the chart's appVersion).
    assert_eq!(arg("VERSION"), env!("CARGO_PKG_VERSION"));
    assert_eq!(
        arg("RUNTIME_IMAGE"),
        "gcr.io/distroless/cc-debian12:nonroot"
    );
    assert!(arg("RUST_IMAGE").starts_with("docker.io/library/rust:"));
    assert_eq!(arg("STRIP"), "all");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    for stage in ["build", "debuginfo", "runtime", "prebuilt", "image"] {
        assert!(
            froms.iter().any(|f| f.ends_with(&format!(" AS {stage}"))),
            "no stage {stage} in {froms:?}"
        );
    }
    // The default target (the last stage) is the from-source build.
    let last = &text[text.rfind("\nFROM ").unwrap()..];
    assert!(last.starts_with("\nFROM runtime AS image"), "{last}");
    assert!(last.contains("COPY --from=build "), "{last}");
    // The CUDA Dockerfile labels the same version.
    let cuda = std::fs::read_to_string(image::repo_root().join("Dockerfile.cuda")).unwrap();
    assert!(
        cuda.lines()
            .any(|l| l == format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"))),
        "Dockerfile.cuda's VERSION differs from the workspace's"
    );
}

#[test]
fn prebuilt_image_is_minimal_and_runs_as_65532() {
    let _group = crate::common::group(module_path!());
    if !can_build() {
        return;
    }
    let built = image::build_prebuilt(&ballast(), TAG).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{TAG}: {:.1} MB, built in {:.1} s",
        built.size_bytes as f64 / 1e6,
        built.build_seconds
    );

    let config = image::config(TAG).unwrap();
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["ballast"]),
        "{config}"
    );
    let labels = &config["Labels"];
    for (key, want) in [
        ("org.opencontainers.image.title", Some("ballast")),
        ("org.opencontainers.image.licenses", Some("Apache-2.0")),
        (
            "org.opencontainers.image.version",
            Some(env!("CARGO_PKG_VERSION")),
        ),
        (
            "org.opencontainers.image.source",
            Some("https://github.com/ballast-dev/ballast"),
        ),
        (
            "org.opencontainers.image.base.name",
            Some(image::RUNTIME_BASE),
        ),
        ("org.opencontainers.image.description", None),
    ] {
        let got = labels[key]
            .as_str()
            .unwrap_or_else(|| panic!("no label {key}: {labels}"));
        assert!(!got.is_empty(), "label {key} is empty");
        if let Some(want) = want {
            assert_eq!(got, want, "label {key}");
        }
    }

    let m = Mounted::new(TAG);
    let root = &m.root;
    // No shell and no other program: the only executable on the PATH is ballast.
    let mut programs = Vec::new();
    for dir in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "usr/local/bin",
        "usr/local/sbin",
    ] {
        for entry in std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            programs.push(format!("/{dir}/{}", entry.file_name().to_string_lossy()));
        }
    }
    assert_eq!(programs, ["/usr/local/bin/ballast"]);
    for shell in [
        "bin/sh",
        "usr/bin/sh",
        "bin/bash",
        "bin/dash",
        "bin/busybox",
    ] {
        assert!(!root.join(shell).exists(), "/{shell} is in the image");
    }
    // The binary: root's, not writable by 65532, stripped.
    let bin = root.join("usr/local/bin/ballast");
    let meta = std::fs::metadata(&bin).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    let sections = sections(&bin);
    assert!(sections.iter().any(|s| s == ".text"), "{sections:?}");
    for gone in [".symtab", ".debug_line", ".debug_info"] {
        assert!(
            !sections.iter().any(|s| s == gone),
            "{gone} in the shipped binary"
        );
    }
    // The base is small: the image is the binary plus at most 15 MB (8 MB in 2026).
    assert!(
        built.size_bytes < meta.len() + 15_000_000,
        "{} bytes for a {}-byte binary",
        built.size_bytes,
        meta.len()
    );
    // User 65532 has a name and a home it owns; /tmp is sticky; TLS has its CA bundle.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l == "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin"),
        "{passwd}"
    );
    let home = std::fs::metadata(root.join("home/nonroot")).unwrap();
    assert_eq!(home.uid(), 65532);
    let tmp = std::fs::metadata(root.join("tmp")).unwrap();
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(bundle.matches("BEGIN CERTIFICATE").count() > 100);

    // It runs from the image's own root filesystem as uid 65532 (the base's glibc, not the
    // host's), and through the image's configuration (PATH, user) with buildah run.
    let want = format!("ballast {}", env!("CARGO_PKG_VERSION"));
    let out = run(Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(root)
        .args(["/usr/local/bin/ballast", "--version"]))
    .unwrap();
    assert_eq!(out.trim(), want);
    let out = run(Command::new("buildah").args([
        "run",
        "--isolation",
        "chroot",
        &m.container,
        "--",
        "ballast",
        "--version",
    ]))
    .unwrap();
    assert_eq!(out.trim(), want);
    drop(m);
    image::remove(TAG).unwrap();
}

/// Each bad input fails with the reason first and buildah's own message after it, and
/// leaves no image behind.
#[test]
fn bad_inputs_fail_saying_which() {
    let _group = crate::common::group(module_path!());
    if !can_build() {
        return;
    }
    let base = image::runtime_base().unwrap();
    let tag = "localhost/ballast:image-test-bad";
    image::remove(tag).unwrap();
    let fails = |context: &Path, base: &str| match image::build_context(context, base, tag) {
        Ok(i) => panic!("built {i:?} from {} on {base:?}", context.display()),
        Err(e) => {
            eprintln!("bad input, as expected: {e}");
            e
        }
    };

    let empty = TempDir::new("empty");
    let e = fails(&empty.0, &base);
    assert!(
        e.starts_with(&format!(
            "no `ballast` binary at the root of the build context {}",
            empty.0.display()
        )),
        "{e}"
    );
    assert!(
        e.contains(r#"copier: stat: "/ballast": no such file or directory"#),
        "{e}"
    );

    let good = TempDir::new("good");
    std::fs::copy(ballast(), good.0.join("ballast")).unwrap();
    let e = fails(&good.0, "localhost/ballast-no-such-base:none");
    assert!(
        e.starts_with("the runtime base RUNTIME_IMAGE=localhost/ballast-no-such-base:none is not in buildah's local store"),
        "{e}"
    );
    assert!(
        e.contains("localhost/ballast-no-such-base:none: image not known"),
        "{e}"
    );

    // An empty argument: the Dockerfile's fallback name says which argument it was.
    let e = fails(&good.0, "");
    assert!(
        e.starts_with("the build argument RUNTIME_IMAGE is empty"),
        "{e}"
    );
    assert!(
        e.contains("build-arg-runtime-image-is-empty: image not known"),
        "{e}"
    );

    // A base that exists but has no glibc.
    let empty_base = "localhost/ballast-image-test-empty:base";
    let ctr = run(Command::new("buildah").args(["from", "scratch"])).unwrap();
    run(Command::new("buildah").args(["commit", "-q", "--rm", ctr.trim(), empty_base])).unwrap();
    let e = fails(&good.0, empty_base);
    image::remove(empty_base).unwrap();
    assert!(
        e.starts_with(&format!(
            "the runtime base RUNTIME_IMAGE={empty_base} cannot run the binary: it has no glibc dynamic loader"
        )),
        "{e}"
    );
    assert!(
        e.contains(r#"building at STEP "RUN ballast --version""#),
        "{e}"
    );

    // Not a binary at all (a script, whose interpreter the base lacks too).
    let text = TempDir::new("text");
    std::fs::write(text.0.join("ballast"), "#!/bin/sh\necho not a binary\n").unwrap();
    std::fs::set_permissions(
        text.0.join("ballast"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let e = fails(&text.0, &base);
    assert!(
        e.starts_with(&format!(
            "the `ballast` in the build context {} is not an ELF executable",
            text.0.display()
        )),
        "{e}"
    );

    // An ELF binary for another machine: the binary under test with its e_machine
    // (bytes 18–19, little-endian) made AArch64's, 183.
    let arm = TempDir::new("arm");
    let mut elf = std::fs::read(ballast()).unwrap();
    assert_ne!(
        &elf[18..20],
        &183u16.to_le_bytes(),
        "this test needs a non-AArch64 host"
    );
    elf[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(arm.0.join("ballast"), elf).unwrap();
    std::fs::set_permissions(
        arm.0.join("ballast"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let e = fails(&arm.0, &base);
    assert!(
        e.starts_with(&format!(
            "the `ballast` in the build context {} was built for another architecture",
            arm.0.display()
        )),
        "{e}"
    );
    assert!(e.contains("exec format error"), "{e}");

    assert!(image::image_id(tag).is_none(), "a failed build left {tag}");
}
