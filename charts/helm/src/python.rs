//! The Python that runs Helm: found through `BALLAST_HELM_PYTHON`, or a venv this crate
//! makes once in a cache folder; and one `helm.py` request run in it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::{Error, parse_violations, template_of};

/// The PyPI package that carries Helm's Go SDK.
pub const SDK_PACKAGE: &str = "helm-python-sdk";
/// The version of it this crate is written against (its C ABI and options).
pub const SDK_VERSION: &str = "0.2.2";

/// The Python half of the crate, run with `python -c`.
const SCRIPT: &str = include_str!("../helm.py");

/// In a venv, written last: the venv is complete. Holds a token unique to this build.
const READY: &str = ".ballast-helm-ready";

/// The folder the venv goes in: `BALLAST_HELM_CACHE`, else `$XDG_CACHE_HOME/ballast-helm`,
/// else `~/.cache/ballast-helm`.
pub(crate) fn default_cache_dir() -> Result<PathBuf, Error> {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = non_empty("BALLAST_HELM_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("ballast-helm"));
    }
    if let Some(home) = non_empty("HOME") {
        return Ok(PathBuf::from(home).join(".cache").join("ballast-helm"));
    }
    Err(Error::Setup(
        "no folder for the Helm venv: set BALLAST_HELM_CACHE (or HOME), or set \
         BALLAST_HELM_PYTHON to a Python that has helm-python-sdk==0.2.2"
            .into(),
    ))
}

/// The venv's folder under `cache_dir`; its name carries the SDK version, so another
/// version gets a venv of its own.
pub(crate) fn venv_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join(format!("venv-{SDK_PACKAGE}-{SDK_VERSION}"))
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

/// The venv's ready token, when the venv is complete.
pub(crate) fn ready_token(cache_dir: &Path) -> Option<String> {
    std::fs::read_to_string(venv_dir(cache_dir).join(READY)).ok()
}

/// The Python of the venv under `cache_dir`, making the venv with `base_python` first
/// when it is not there (or when it is the broken one whose token is `broken`).
///
/// Processes and threads that get here at once take turns on a lock file in
/// `cache_dir`; the first makes the venv and the others find it made.
pub(crate) fn ensure_venv(
    cache_dir: &Path,
    base_python: &Path,
    broken: Option<&str>,
) -> Result<(PathBuf, bool), Error> {
    let venv = venv_dir(cache_dir);
    let python = venv_python(&venv);
    let usable = |token: Option<String>| token.is_some_and(|t| Some(t.as_str()) != broken);
    if usable(ready_token(cache_dir)) {
        return Ok((python, false));
    }
    std::fs::create_dir_all(cache_dir).map_err(|e| {
        Error::Setup(format!(
            "cannot create the Helm cache folder {}: {e} (set BALLAST_HELM_CACHE elsewhere)",
            cache_dir.display()
        ))
    })?;
    let lock_path = cache_dir.join("venv.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| Error::Setup(format!("cannot lock {}: {e}", lock_path.display())))?;
    // Another process may have made it while this one waited.
    if usable(ready_token(cache_dir)) {
        return Ok((python, false));
    }
    if venv.exists() {
        std::fs::remove_dir_all(&venv).map_err(|e| {
            Error::Setup(format!(
                "cannot remove the unfinished venv {}: {e}",
                venv.display()
            ))
        })?;
    }
    make_venv(&venv, base_python)?;
    install_sdk(&venv, &python)?;
    let token = format!(
        "{} {}\n",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    std::fs::write(venv.join(READY), token)
        .map_err(|e| Error::Setup(format!("cannot write {}: {e}", venv.join(READY).display())))?;
    drop(lock);
    Ok((python, true))
}

fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = s.trim_end().lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn make_venv(venv: &Path, base_python: &Path) -> Result<(), Error> {
    let out = Command::new(base_python)
        .arg("-m")
        .arg("venv")
        .arg(venv)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Error::Setup(format!(
                "cannot run {} to make the Helm venv: {e}. Install Python 3.10 or newer, or \
                 set BALLAST_HELM_PYTHON to a Python that has {SDK_PACKAGE}=={SDK_VERSION}",
                base_python.display()
            ))
        })?;
    if out.status.success() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(venv);
    let mut said = tail(&out.stderr);
    if said.is_empty() {
        said = tail(&out.stdout);
    }
    Err(Error::Setup(format!(
        "`{} -m venv {}` failed ({}). On Debian or Ubuntu this means the python3-venv \
         package is missing: `apt-get install python3-venv`. Or set BALLAST_HELM_PYTHON \
         to a Python that has {SDK_PACKAGE}=={SDK_VERSION}.\n{said}",
        base_python.display(),
        venv.display(),
        out.status
    )))
}

fn install_sdk(venv: &Path, python: &Path) -> Result<(), Error> {
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
        ])
        .arg(format!("{SDK_PACKAGE}=={SDK_VERSION}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Setup(format!("cannot run {}: {e}", python.display())))?;
    if out.status.success() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(venv);
    Err(Error::Setup(format!(
        "pip could not install {SDK_PACKAGE}=={SDK_VERSION} into {} ({}): is PyPI reachable, \
         and is there a wheel for this platform? Or set BALLAST_HELM_PYTHON to a Python \
         that has it.\n{}",
        venv.display(),
        out.status,
        tail(&out.stderr)
    )))
}

/// helm.py's reply.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Reply {
    Ok(Json),
    Error { kind: String, message: String },
}

/// Runs one request in `python` and returns its result, or the error it maps to.
pub(crate) fn call(python: &Path, request: &Json) -> Result<Json, Error> {
    let python_error = |message: String, stderr: String| Error::Python { message, stderr };
    let mut child = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            python_error(
                format!("cannot run {}: {e}", python.display()),
                String::new(),
            )
        })?;
    // helm.py reads the whole request before it writes anything, so this cannot block
    // on a full stdout pipe. A child that died early makes this fail; its exit says why.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(request.to_string().as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| {
        python_error(
            format!("waiting for {}: {e}", python.display()),
            String::new(),
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let reply: Reply = serde_json::from_str(stdout.trim()).map_err(|e| {
        python_error(
            format!(
                "{} did not answer helm.py's way ({}; {e}); stdout: {:?}",
                python.display(),
                out.status,
                stdout.chars().take(300).collect::<String>()
            ),
            stderr.clone(),
        )
    })?;
    match reply {
        Reply::Ok(v) => Ok(v),
        Reply::Error { kind, message } => Err(to_error(python, &kind, message, stderr)),
    }
}

fn to_error(python: &Path, kind: &str, message: String, stderr: String) -> Error {
    let message = message.trim_end().to_string();
    match kind {
        "values_yaml" => Error::ValuesYaml(message),
        "schema" => {
            // Helm lists a group's violations in no fixed order.
            let mut violations = parse_violations(&message);
            violations.sort_by(|a, b| {
                (&a.chart, &a.path, &a.message).cmp(&(&b.chart, &b.path, &b.message))
            });
            Error::Schema {
                violations,
                message,
            }
        }
        "values" => Error::Values(message),
        "render" => Error::Render {
            template: template_of(&message),
            message,
        },
        "chart" => Error::Chart(message),
        "kube" => Error::Kube(message),
        "release" => Error::Release(message),
        "not_found" => Error::NotFound(message),
        "invalid_argument" => Error::InvalidArgument(message),
        "no_sdk" => Error::Setup(format!(
            "{} cannot import helm_python ({message}): install {SDK_PACKAGE}=={SDK_VERSION} \
             into it, or unset BALLAST_HELM_PYTHON to have a venv made",
            python.display()
        )),
        k if k.starts_with("helm:") => Error::Helm {
            kind: k["helm:".len()..].to_string(),
            message,
        },
        _ => Error::Python { message, stderr },
    }
}
