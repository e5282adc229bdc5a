//! The project's container image, built here without a registry: the repository's
//! `Dockerfile`, target `prebuilt`, with buildah, on a runtime base assembled from Debian
//! packages with mmdebstrap.
//!
//! [`runtime_base`] makes the base once (the root filesystem as a tarball under
//! `~/.cache/ballast-image/`, the image in buildah's store) and [`build_prebuilt`] puts a
//! `ballast` binary on it. The base stands in for `gcr.io/distroless/cc-debian12:nonroot`,
//! the Dockerfile's default: glibc, libgcc_s, CA certificates, time zones, `/etc/services`,
//! users `root`, `nobody` and `nonroot` (65532) and a sticky `/tmp`, and no program at all —
//! no shell, no package manager, no `ldconfig`.
//!
//! buildah, mmdebstrap and the host's `strip` and `tar` are needed, and root (buildah's
//! chroot isolation, files owned by 65532); [`tools`] says what is missing.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::process::{run, which};

/// The runtime base [`runtime_base`] makes, in buildah's local store.
pub const RUNTIME_BASE: &str = "localhost/ballast-runtime-base:bookworm";

/// The Debian release of the base: the one `gcr.io/distroless/cc-debian12` is built from.
pub const DEBIAN_SUITE: &str = "bookworm";

/// The Debian packages of the base (apt adds their dependencies, whose programs are then
/// removed): glibc and libgcc_s for the binary, CA certificates for TLS, time zones for
/// logs, `/etc/services` and `/etc/protocols` for the resolver, `/etc/os-release`.
pub const BASE_PACKAGES: [&str; 6] = [
    "libc6",
    "libgcc-s1",
    "ca-certificates",
    "tzdata",
    "netbase",
    "base-files",
];

/// Changes whenever what [`runtime_base`] puts in the base changes; stored as the base's
/// label `dev.ballast.runtime-base.recipe`, so an older base is rebuilt, not reused.
const RECIPE: &str = "2";

/// The label holding [`RECIPE`].
const RECIPE_LABEL: &str = "dev.ballast.runtime-base.recipe";

/// The version label the image gets (`--build-arg VERSION`): the workspace's version,
/// which is the `ballast` binary's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An image in buildah's local store.
#[derive(Debug, Clone)]
pub struct Image {
    /// The reference it was tagged with, e.g. `localhost/ballast:e2e`.
    pub reference: String,
    /// Its image ID (the config's digest, hex).
    pub id: String,
    /// The size of its layers, uncompressed (what `buildah images` shows), in bytes.
    pub size_bytes: u64,
    /// How long `buildah bud` took, in seconds (the base is made before the clock starts).
    pub build_seconds: f64,
}

/// The repository's root directory (where the `Dockerfile` is).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// The repository's `Dockerfile`.
pub fn dockerfile() -> PathBuf {
    repo_root().join("Dockerfile")
}

/// Ok when this machine can build the image, else the reason, naming each program missing
/// (with its Debian package) or that root is needed.
pub fn tools() -> Result<(), String> {
    let missing: Vec<String> = [
        ("buildah", "buildah"),
        ("mmdebstrap", "mmdebstrap"),
        ("strip", "binutils"),
        ("tar", "tar"),
    ]
    .iter()
    .filter(|(cmd, _)| which(cmd).is_none())
    .map(|(cmd, package)| format!("{cmd} (Debian package {package})"))
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "building the image needs {} on the PATH",
            missing.join(", ")
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "building the image needs root (buildah's chroot isolation, files owned by 65532)"
                .into(),
        );
    }
    Ok(())
}

/// The directory of the cached base tarball: `$XDG_CACHE_HOME/ballast-image`, else
/// `~/.cache/ballast-image`.
pub fn cache_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("ballast-image"));
    }
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ballast-image"))
}

/// Makes the runtime base, unless buildah's store already has it (from this recipe), and
/// returns its reference, [`RUNTIME_BASE`].
///
/// The root filesystem is made once, by `mmdebstrap --variant=extract` (the packages'
/// files, no maintainer scripts, so nothing runs inside it) from [`BASE_PACKAGES`], then
/// tidied here: every program removed, and the libraries and data nothing uses (OpenSSL,
/// iconv modules, debconf, apt and dpkg state); `/etc/passwd`, `/etc/group` and
/// `/etc/nsswitch.conf` written; the CA bundle `/etc/ssl/certs/ca-certificates.crt`
/// assembled (as update-ca-certificates would have); `/home/nonroot` made for 65532. It
/// is kept as `runtime-base-bookworm-rRECIPE.tar` in [`cache_dir`], so a later base needs
/// no network. The image is that tarball as one layer, with `PATH` set and user
/// 65532:65532 (as distroless `:nonroot`). Concurrent callers wait on a lock file in the
/// cache directory.
pub fn runtime_base() -> Result<String, String> {
    tools()?;
    let dir = cache_dir()?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _lock = Lock::take(&dir.join("lock"))?;
    if image_label(RUNTIME_BASE, RECIPE_LABEL).as_deref() == Some(RECIPE) {
        return Ok(RUNTIME_BASE.to_string());
    }
    let tarball = dir.join(format!("runtime-base-{DEBIAN_SUITE}-r{RECIPE}.tar"));
    // Tarballs of earlier recipes are never used again.
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("runtime-base-") && entry.path() != tarball {
            remove_tree(&entry.path())?;
        }
    }
    let previous = image_id(RUNTIME_BASE);
    if !tarball.is_file() {
        make_rootfs_tarball(&dir, &tarball)?;
    }
    let ctr = run(Command::new("buildah").args(["from", "scratch"]))?
        .trim()
        .to_string();
    let result = (|| {
        let tar = tarball.to_str().ok_or("cache path is not UTF-8")?;
        // A local tarball is extracted into the container, owners and modes kept.
        run(Command::new("buildah").args(["add", &ctr, tar, "/"]))?;
        run(Command::new("buildah").args([
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--user",
            "65532:65532",
            "--label",
            &format!("{RECIPE_LABEL}={RECIPE}"),
            "--label",
            &format!(
                "org.opencontainers.image.description=glibc runtime base from Debian {DEBIAN_SUITE} packages {}",
                BASE_PACKAGES.join(",")
            ),
            &ctr,
        ]))?;
        run(Command::new("buildah").args(["commit", "-q", "--rm", &ctr, RUNTIME_BASE]))
    })();
    if result.is_err() {
        let _ = run(Command::new("buildah").args(["rm", &ctr]));
    }
    result?;
    // The base of an earlier recipe lost its name to this one; images built on it keep it.
    if let Some(old) = previous {
        let _ = run(Command::new("buildah").args(["rmi", &old]));
    }
    Ok(RUNTIME_BASE.to_string())
}

/// Runs mmdebstrap into a directory under `dir`, tidies it, and writes it as `tarball`
/// (through a temporary name, so a tarball is never half-written).
fn make_rootfs_tarball(dir: &Path, tarball: &Path) -> Result<(), String> {
    let root = dir.join("rootfs.partial");
    remove_tree(&root)?;
    let include = format!("--include={}", BASE_PACKAGES.join(","));
    let made = run(Command::new("mmdebstrap")
        .args([
            "--quiet",
            "--variant=extract",
            "--mode=root",
            &include,
            DEBIAN_SUITE,
        ])
        .arg(&root))
    .map_err(|e| format!("mmdebstrap (needs a Debian mirror; deb.debian.org by default): {e}"));
    let result = made.and_then(|_| tidy_rootfs(&root)).and_then(|()| {
        let partial = tarball.with_extension("tar.partial");
        run(Command::new("tar")
            .args(["--numeric-owner", "--sort=name", "-cf"])
            .arg(&partial)
            .arg("-C")
            .arg(&root)
            .arg("."))?;
        std::fs::rename(&partial, tarball).map_err(|e| format!("{}: {e}", tarball.display()))
    });
    remove_tree(&root)?;
    result
}

/// Makes the extracted packages a runtime base (see [`runtime_base`]).
fn tidy_rootfs(root: &Path) -> Result<(), String> {
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    // No programs: the image runs only the binary added on top. (Dependencies brought
    // mawk, openssl, debconf and update-ca-certificates; the image needs none of them.)
    for bin in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "usr/local/bin",
        "usr/local/sbin",
    ] {
        let d = root.join(bin);
        if d.is_symlink() {
            continue;
        }
        remove_tree(&d)?;
        std::fs::create_dir_all(&d).map_err(|e| io(&d, e))?;
    }
    // What the dependencies brought that nothing here uses: debconf's Perl modules, the
    // OpenSSL libraries and scripts (the binary uses rustls), glibc's iconv modules (it
    // never calls iconv), manuals, apt's and dpkg's empty state (no package manager), a
    // motd script, and the host's hostname and resolv.conf that mmdebstrap copied in (the
    // runtime mounts its own). Licences (the copyright files) stay. Running on less than
    // distroless has is the conservative side: what runs here runs there.
    for gone in [
        "usr/share/perl5",
        "usr/share/debconf",
        "var/cache/debconf",
        "etc/debconf.conf",
        "usr/share/man",
        "usr/share/info",
        "usr/share/lintian",
        "usr/share/locale",
        "usr/lib/ssl/misc",
        "var/cache/apt",
        "var/lib/apt",
        "var/lib/dpkg",
        "etc/update-motd.d",
        "etc/hostname",
        "etc/resolv.conf",
    ] {
        remove_tree(&root.join(gone))?;
    }
    for multiarch in std::fs::read_dir(root.join("usr/lib"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if !multiarch
            .file_name()
            .to_string_lossy()
            .ends_with("-linux-gnu")
        {
            continue;
        }
        for gone in [
            "gconv",
            "engines-3",
            "ossl-modules",
            "libssl.so.3",
            "libcrypto.so.3",
        ] {
            remove_tree(&multiarch.path().join(gone))?;
        }
    }
    let doc = root.join("usr/share/doc");
    if let Ok(entries) = std::fs::read_dir(&doc) {
        for package in entries.flatten() {
            for f in std::fs::read_dir(package.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if f.file_name() != "copyright" {
                    remove_tree(&f.path())?;
                }
            }
        }
    }

    let write = |rel: &str, text: &str, mode: u32| -> Result<(), String> {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        std::fs::write(&p, text).map_err(|e| io(&p, e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(|e| io(&p, e))
    };
    // Users and groups, so that uid 65532 has a name and a home (runc sets HOME from it)
    // and getpwuid works; no login shell exists.
    write(
        "etc/passwd",
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        0o644,
    )?;
    write(
        "etc/group",
        "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
        0o644,
    )?;
    // glibc's default without this file asks DNS before /etc/hosts.
    write(
        "etc/nsswitch.conf",
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n\
         networks: files\nprotocols: files\nservices: files\n",
        0o644,
    )?;

    // The CA bundle update-ca-certificates would have written (its maintainer script did
    // not run): every certificate ca-certificates ships, in name order.
    let mut certs = Vec::new();
    collect_files(&root.join("usr/share/ca-certificates"), "crt", &mut certs)?;
    certs.sort();
    if certs.is_empty() {
        return Err("mmdebstrap's tree has no certificates under usr/share/ca-certificates".into());
    }
    let mut bundle = Vec::new();
    for c in &certs {
        let pem = std::fs::read(c).map_err(|e| io(c, e))?;
        bundle.extend_from_slice(&pem);
        if !pem.ends_with(b"\n") {
            bundle.push(b'\n');
        }
    }
    let bundle_path = root.join("etc/ssl/certs/ca-certificates.crt");
    std::fs::create_dir_all(bundle_path.parent().unwrap()).map_err(|e| io(&bundle_path, e))?;
    std::fs::File::create(&bundle_path)
        .and_then(|mut f| f.write_all(&bundle))
        .map_err(|e| io(&bundle_path, e))?;

    // The home of 65532, its own; /tmp sticky and world-writable (base-files has it so;
    // checked rather than assumed).
    let home = root.join("home/nonroot");
    std::fs::create_dir_all(&home).map_err(|e| io(&home, e))?;
    std::os::unix::fs::chown(&home, Some(65532), Some(65532)).map_err(|e| io(&home, e))?;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io(&home, e))?;
    for tmp in ["tmp", "var/tmp"] {
        let p = root.join(tmp);
        std::fs::create_dir_all(&p).map_err(|e| io(&p, e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| io(&p, e))?;
    }
    // What the binary links (ldd: the loader, libc, libm, libgcc_s), as files of the tree
    // itself: symlink_metadata, since an absolute link would be followed on the host.
    if cfg!(target_arch = "x86_64") {
        for lib in [
            "lib64/ld-linux-x86-64.so.2",
            "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libm.so.6",
            "lib/x86_64-linux-gnu/libgcc_s.so.1",
        ] {
            if std::fs::symlink_metadata(root.join(lib)).is_err() {
                return Err(format!("mmdebstrap's tree has no /{lib}"));
            }
        }
    }
    Ok(())
}

/// Every file under `dir` whose name ends `.EXT`, recursively (following no symlinks to
/// directories).
fn collect_files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries.flatten() {
        let p = entry.path();
        let ty = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if ty.is_dir() {
            collect_files(&p, ext, out)?;
        } else if p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
    Ok(())
}

/// Removes `p`: a directory with everything in it, or a file or symlink (never followed).
/// Ok when it was not there.
fn remove_tree(p: &Path) -> Result<(), String> {
    let removed = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// An exclusive `flock(2)` on a file, released when dropped (or when the process exits).
struct Lock(std::fs::File);

impl Lock {
    fn take(path: &Path) -> Result<Lock, String> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor this File owns; it blocks until the lock is free.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "flock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Lock(f))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking our own descriptor; closing it would release the lock anyway.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Builds `binary` into the image `tag`: strips it (`strip --strip-all`) into a temporary
/// build context that holds nothing else, then [`build_context`] with the
/// [`runtime_base`].
pub fn build_prebuilt(binary: &Path, tag: &str) -> Result<Image, String> {
    tools()?;
    if !binary.is_file() {
        return Err(format!("no binary at {}", binary.display()));
    }
    let base = runtime_base()?;
    let context = TempDir::new("ballast-image-context")?;
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(context.0.join("ballast"))
        .arg(binary))?;
    build_context(&context.0, &base, tag)
}

/// Runs `buildah bud --isolation chroot --pull=never --target prebuilt` on the
/// repository's Dockerfile with the build context `context` (which must hold the binary as
/// `ballast` at its root), `RUNTIME_IMAGE=base` and `VERSION=`[`VERSION`], tagged `tag`.
/// The image `tag` named before, if any, is removed once the new one has its name, so
/// rebuilding does not pile up untagged images.
///
/// On failure the error starts with what was wrong — no binary in the context, a base not
/// in the store, a base that cannot run the binary — and goes on with buildah's own
/// message (the `Error:` line and what the failed step printed).
pub fn build_context(context: &Path, base: &str, tag: &str) -> Result<Image, String> {
    let previous = image_id(tag);
    let started = Instant::now();
    let mut cmd = Command::new("buildah");
    cmd.args([
        "bud",
        "--isolation",
        "chroot",
        "--pull=never",
        "--target",
        "prebuilt",
    ])
    .arg("-f")
    .arg(dockerfile())
    .args(["--build-arg", &format!("RUNTIME_IMAGE={base}")])
    .args(["--build-arg", &format!("VERSION={VERSION}")])
    .args(["-t", tag])
    .arg(context);
    let out = cmd.output().map_err(|e| format!("buildah bud: {e}"))?;
    let build_seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(explain_failure(context, base, &stdout, &stderr));
    }
    let id = image_id(tag)
        .ok_or_else(|| format!("buildah bud succeeded but {tag} is not in the store"))?;
    if let Some(old) = previous.filter(|old| *old != id) {
        // Still used by a container, or by another tag: then it stays, which is fine.
        let _ = run(Command::new("buildah").args(["rmi", &old]));
    }
    Ok(Image {
        reference: tag.to_string(),
        size_bytes: image_size(&id)?,
        id,
        build_seconds,
    })
}

/// What a failed `buildah bud` of the prebuilt target means, then buildah's words.
fn explain_failure(context: &Path, base: &str, stdout: &str, stderr: &str) -> String {
    let error = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("Error:"))
        .unwrap_or(stderr.trim())
        .trim();
    // What the failed step printed (its output on stdout, a failed exec on stderr), without
    // buildah's progress lines and its final error.
    let printed: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines().filter(|l| !l.starts_with("Error:")))
        .filter(|l| {
            !l.starts_with('[')
                && !l.starts_with("-->")
                && !l.starts_with("Getting image")
                && !l.starts_with("Copying ")
                && !l.starts_with("Writing manifest")
                && !l.starts_with("Storing signatures")
                && !l.trim().is_empty()
        })
        .collect();
    let what = if error.contains("STEP \"COPY") && error.contains("no such file or directory") {
        format!(
            "no `ballast` binary at the root of the build context {}",
            context.display()
        )
    } else if error.contains("creating build container") && base.is_empty() {
        "the build argument RUNTIME_IMAGE is empty".to_string()
    } else if error.contains("creating build container") {
        format!(
            "the runtime base RUNTIME_IMAGE={base} is not in buildah's local store (the build never pulls)"
        )
    } else if error.contains("STEP \"RUN ballast --version\"") {
        let head = std::fs::read(context.join("ballast"))
            .map(|b| b[..b.len().min(20)].to_vec())
            .unwrap_or_default();
        if !head.starts_with(b"\x7fELF") {
            format!(
                "the `ballast` in the build context {} is not an ELF executable",
                context.display()
            )
        } else if printed.iter().any(|l| l.contains("exec format error")) {
            format!(
                "the `ballast` in the build context {} was built for another architecture",
                context.display()
            )
        } else if printed
            .iter()
            .any(|l| l.contains("no such file or directory"))
        {
            format!(
                "the runtime base RUNTIME_IMAGE={base} cannot run the binary: it has no glibc dynamic loader"
            )
        } else {
            format!(
                "the runtime base RUNTIME_IMAGE={base} cannot run the binary: it needs glibc 2.34 or newer and libgcc_s"
            )
        }
    } else {
        "buildah bud of the prebuilt target failed".to_string()
    };
    if printed.is_empty() {
        format!("{what}: {error}")
    } else {
        format!(
            "{what}: {error} (the step printed: {})",
            printed.join(" / ")
        )
    }
}

/// The image ID `reference` names in buildah's store, if any.
pub fn image_id(reference: &str) -> Option<String> {
    run(Command::new("buildah").args([
        "inspect",
        "--type",
        "image",
        "--format",
        "{{.FromImageID}}",
        reference,
    ]))
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty())
}

/// The value of label `key` on image `reference`, if the image exists and has it.
fn image_label(reference: &str, key: &str) -> Option<String> {
    let config = config(reference).ok()?;
    config["Labels"][key].as_str().map(str::to_string)
}

/// The OCI image configuration of `reference` (`User`, `Entrypoint`, `Env`, `Labels`, …),
/// as `buildah inspect` reports it.
pub fn config(reference: &str) -> Result<serde_json::Value, String> {
    Ok(inspect(reference)?["OCIv1"]["config"].clone())
}

/// The size of image `id`'s layers as uncompressed tar streams, in bytes: the sum of the
/// layer sizes in its manifest (buildah stores its own builds' layers uncompressed; a
/// registry push gzips them).
fn image_size(id: &str) -> Result<u64, String> {
    let v = inspect(id)?;
    let manifest: serde_json::Value = serde_json::from_str(v["Manifest"].as_str().unwrap_or(""))
        .map_err(|e| format!("the manifest of {id}: {e}"))?;
    let layers = manifest["layers"]
        .as_array()
        .ok_or_else(|| format!("the manifest of {id} lists no layers"))?;
    Ok(layers.iter().filter_map(|l| l["size"].as_u64()).sum())
}

/// `buildah inspect --type image` of `reference`, parsed.
fn inspect(reference: &str) -> Result<serde_json::Value, String> {
    let json = run(Command::new("buildah").args(["inspect", "--type", "image", reference]))?;
    serde_json::from_str(&json).map_err(|e| format!("buildah inspect {reference}: {e}"))
}

/// Removes image `reference` from buildah's store (Ok if it was not there).
pub fn remove(reference: &str) -> Result<(), String> {
    if image_id(reference).is_none() {
        return Ok(());
    }
    run(Command::new("buildah").args(["rmi", reference])).map(|_| ())
}

/// A directory under the system temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Result<TempDir, String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
