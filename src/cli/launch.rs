//! `lmx launch`: starts the ranks of a data-parallel run with the environment MLX's backends read,
//! as Python MLX's `mlx.launch` does, and ends them all when one fails.
//!
//! On one host (`-n N`) each rank is a child process. With a host file (`mlx.launch`'s JSON:
//! a list of `{"ssh": ..., "ips": [...]}`, or an object with `hosts`, `backend` and `envs`) rank
//! `r` runs on the `r`-th host, through `ssh` unless the host is this one, with the same `lmx`
//! path and working directory. The ring backend gets `MLX_RANK` and `MLX_HOSTFILE` (a JSON list
//! of each rank's `ip:port`); NCCL gets `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT`
//! and `CUDA_VISIBLE_DEVICES` (the rank's GPU among its host's).

use clap::{Args, ValueEnum};
use lmx::runtime::distributed::{Backend, BACKEND_VAR, TIMEOUT_VAR};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// `lmx launch`'s options.
#[derive(Args)]
pub struct LaunchArgs {
    /// Ranks on this host.
    #[arg(short = 'n', long, default_value_t = 1, conflicts_with = "hostfile")]
    pub processes: usize,
    /// A host file in `mlx.launch`'s JSON format: one rank per host.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// MLX's distributed backend (default: the host file's, else nccl on a CUDA build, else
    /// ring).
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// The first port of the ring backend on each host (default on one host: free ports).
    #[arg(long)]
    pub starting_port: Option<u16>,
    /// The port of NCCL's rendezvous on rank 0's host (default on one host: a free port).
    #[arg(long)]
    pub nccl_port: Option<u16>,
    /// Seconds a rank may go without training progress before it stops itself, its peers
    /// having most likely failed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Shard the optimizer state over the ranks (ZeRO-1; needs the flat state).
    #[arg(long)]
    pub shard_optimizer: bool,
    /// Where the gradients are summed over the ranks.
    #[arg(long, value_enum, default_value = "in-step")]
    pub reduce: ReduceArg,
    /// With `--reduce overlap`: the largest bucket of gradients summed at once, in MiB (default
    /// 25, PyTorch DDP's).
    #[arg(long, value_name = "MIB")]
    pub bucket_mb: Option<f64>,
    /// Environment variables for every rank (`NAME=VALUE`, repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// The `lmx` command each rank runs (after `--`): `train ...`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// `--backend`'s choices.
#[derive(Clone, Copy, ValueEnum)]
pub enum BackendArg {
    /// MLX's TCP ring.
    Ring,
    /// NVIDIA's NCCL.
    Nccl,
    /// MPI (the ranks are started by `mpirun`, not by `lmx launch`).
    Mpi,
}

/// `--reduce`'s choices.
#[derive(Clone, Copy, ValueEnum)]
pub enum ReduceArg {
    /// Inside the compiled step.
    InStep,
    /// Between the step's compiled functions.
    AfterStep,
    /// During the backward pass, bucket by bucket, on a stream of their own (the flat state's).
    Overlap,
}

/// Seconds the other ranks get to end after one failed, before they are killed.
const GRACE: Duration = Duration::from_secs(10);

/// One host of a host file.
#[derive(Clone, Debug, PartialEq)]
struct Host {
    ssh: String,
    ip: Option<String>,
}

/// Starts the ranks, waits for them, and fails naming the first rank that failed.
pub fn run(args: &LaunchArgs) -> anyhow::Result<()> {
    let (hosts, file_backend, file_envs) = match &args.hostfile {
        Some(path) => read_hostfile(path)?,
        None => {
            if args.processes == 0 {
                anyhow::bail!("-n must be at least 1");
            }
            let local = Host {
                ssh: "127.0.0.1".into(),
                ip: Some("127.0.0.1".into()),
            };
            (vec![local; args.processes], None, Vec::new())
        }
    };
    let backend = match (args.backend, file_backend) {
        (Some(BackendArg::Ring), _) => Backend::Ring,
        (Some(BackendArg::Nccl), _) => Backend::Nccl,
        (Some(BackendArg::Mpi), _) => Backend::Mpi,
        (None, Some(backend)) => backend,
        (None, None) if lmx::runtime::cuda::available() => Backend::Nccl,
        (None, None) => Backend::Ring,
    };
    if backend == Backend::Mpi || backend == Backend::Any {
        anyhow::bail!(
            "lmx launch starts the ring and nccl backends; start MPI ranks with mpirun, \
             setting {BACKEND_VAR}=mpi"
        );
    }
    let single_host = args.hostfile.is_none();
    let mut common: BTreeMap<String, String> = BTreeMap::new();
    for pair in file_envs.iter().chain(&args.env) {
        let Some((name, value)) = pair.split_once('=') else {
            anyhow::bail!("--env {pair}: give NAME=VALUE");
        };
        common.insert(name.into(), value.into());
    }
    common.insert(BACKEND_VAR.into(), backend.name().into());
    common.insert(TIMEOUT_VAR.into(), args.timeout.to_string());
    if args.shard_optimizer {
        common.insert(super::parallel::SHARD_VAR.into(), "1".into());
    }
    match (args.reduce, args.bucket_mb) {
        (ReduceArg::InStep, None) => {}
        (ReduceArg::AfterStep, None) => {
            common.insert(super::parallel::REDUCE_VAR.into(), "after-step".into());
        }
        (ReduceArg::Overlap, bucket_mb) => {
            common.insert(super::parallel::REDUCE_VAR.into(), "overlap".into());
            if let Some(bucket_mb) = bucket_mb {
                if !(bucket_mb > 0.0 && bucket_mb.is_finite()) {
                    anyhow::bail!("--bucket-mb {bucket_mb}: give a positive size in MiB");
                }
                let bytes = (bucket_mb * f64::from(1 << 20)).ceil() as usize;
                common.insert(super::parallel::BUCKET_VAR.into(), bytes.to_string());
            }
        }
        (_, Some(_)) => anyhow::bail!("--bucket-mb sizes the buckets of --reduce overlap"),
    }
    let world = hosts.len();
    match backend {
        Backend::Ring => {
            let ports = match (args.starting_port, single_host) {
                (None, true) => free_ports(world)?,
                (start, _) => {
                    let start = start.unwrap_or(32323);
                    (0..world).map(|rank| start + rank as u16).collect()
                }
            };
            let ring = hosts
                .iter()
                .zip(&ports)
                .map(|(host, port)| {
                    let ip = host.ip.as_ref().ok_or_else(|| {
                        anyhow::anyhow!(
                            "host `{}`: the ring backend needs its IP (\"ips\" in the host file)",
                            host.ssh
                        )
                    })?;
                    Ok(vec![format!("{ip}:{port}")])
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            common.insert("MLX_HOSTFILE_JSON".into(), serde_json::to_string(&ring)?);
        }
        Backend::Nccl => {
            let ip = hosts[0].ip.clone().ok_or_else(|| {
                anyhow::anyhow!("rank 0's host needs an IP the others reach (\"ips\")")
            })?;
            let port = match (args.nccl_port, single_host) {
                (Some(port), _) => port,
                (None, true) => free_ports(1)?[0],
                (None, false) => 12345,
            };
            common.insert("NCCL_HOST_IP".into(), ip);
            common.insert("NCCL_PORT".into(), port.to_string());
            common.insert("MLX_WORLD_SIZE".into(), world.to_string());
        }
        Backend::Mpi | Backend::Any => unreachable!("refused above"),
    }
    let exe = std::env::current_exe()?;
    let cwd = std::env::current_dir()?;
    let mut per_host: BTreeMap<&str, usize> = BTreeMap::new();
    let mut children = Vec::with_capacity(world);
    for (rank, host) in hosts.iter().enumerate() {
        let local_index = per_host.entry(host.ssh.as_str()).or_insert(0);
        let mut env = common.clone();
        env.insert("MLX_RANK".into(), rank.to_string());
        if backend == Backend::Nccl && !env.contains_key("CUDA_VISIBLE_DEVICES") {
            env.insert("CUDA_VISIBLE_DEVICES".into(), local_index.to_string());
        }
        *local_index += 1;
        let child = spawn(host, &exe, &cwd, &env, &args.command)?;
        eprintln!(
            "lmx launch: rank {rank} on {}: pid {}",
            host.ssh,
            child.id()
        );
        children.push(child);
    }
    supervise(children)
}

/// Starts one rank: here, or through `ssh`. The ring's host list travels as JSON in the
/// environment and is written to a file where the rank runs.
fn spawn(
    host: &Host,
    exe: &Path,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    command: &[String],
) -> anyhow::Result<Child> {
    let mut exports = String::new();
    for (name, value) in env {
        if name == "MLX_HOSTFILE_JSON" {
            exports.push_str(&format!(
                "export MLX_HOSTFILE=$(mktemp) && printf '%s' {} > \"$MLX_HOSTFILE\" && ",
                quote(value)
            ));
        } else {
            exports.push_str(&format!("export {name}={} && ", quote(value)));
        }
    }
    let mut line = vec![quote(&exe.to_string_lossy())];
    line.extend(command.iter().map(|word| quote(word)));
    let script = format!(
        "cd {} && {exports}exec {}",
        quote(&cwd.to_string_lossy()),
        line.join(" ")
    );
    let mut process = if is_local(&host.ssh) {
        let mut process = Command::new("/bin/sh");
        process.arg("-c").arg(&script);
        process
    } else {
        let mut process = Command::new("ssh");
        process.arg(&host.ssh).arg(&script);
        process
    };
    // Each rank in a process group of its own: a Ctrl-C at the terminal reaches the launcher,
    // which passes it on to every rank once.
    std::os::unix::process::CommandExt::process_group(&mut process, 0);
    process
        .spawn()
        .map_err(|err| anyhow::anyhow!("could not start rank on {}: {err}", host.ssh))
}

/// Waits for every rank; when one fails, ends the others (SIGTERM, then SIGKILL after
/// [`GRACE`]) and fails naming it. SIGINT and SIGTERM sent to the launcher are passed on.
fn supervise(mut children: Vec<Child>) -> anyhow::Result<()> {
    let signal = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for number in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_usize(number, signal.clone(), number as usize)?;
    }
    let mut status: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut ending_since: Option<Instant> = None;
    // The signal passed on, if one was: the ranks then stop after the same step, with a
    // checkpoint, and exit as the signal would have.
    let mut passed_on: Option<i32> = None;
    loop {
        let forwarded = signal.swap(0, std::sync::atomic::Ordering::SeqCst);
        if forwarded != 0 {
            signal_all(&children, &status, forwarded as i32);
            passed_on = Some(forwarded as i32);
        }
        for (rank, child) in children.iter_mut().enumerate() {
            if status[rank].is_none() {
                if let Some(exit) = child.try_wait()? {
                    status[rank] = Some(exit);
                    let stopped = passed_on.is_some_and(|signal| exit.code() == Some(128 + signal));
                    if !exit.success() && !stopped && failed.is_none() {
                        failed = Some((rank, exit));
                    }
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        if let Some((rank, exit)) = failed {
            match ending_since {
                None => {
                    eprintln!(
                        "lmx launch: rank {rank} {}; stopping the other ranks",
                        describe(exit)
                    );
                    signal_all(&children, &status, libc::SIGTERM);
                    ending_since = Some(Instant::now());
                }
                Some(since) if since.elapsed() > GRACE => {
                    signal_all(&children, &status, libc::SIGKILL);
                }
                Some(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    match (failed, passed_on) {
        (Some((rank, exit)), _) => anyhow::bail!("rank {rank} {}", describe(exit)),
        (None, Some(signal)) => anyhow::bail!("the ranks stopped on signal {signal}"),
        (None, None) => Ok(()),
    }
}

/// Sends `signal` to every rank still running.
fn signal_all(children: &[Child], status: &[Option<ExitStatus>], signal: i32) {
    for (child, status) in children.iter().zip(status) {
        if status.is_none() {
            // SAFETY: kill only sends a signal, to a child this process started and has not
            // reaped (its pid cannot have been reused).
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
    }
}

/// How a rank ended, in words.
fn describe(exit: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (exit.code(), exit.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".into(),
    }
}

/// `count` TCP ports free on this host now (bound, then released).
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect::<std::io::Result<Vec<_>>>()?)
}

fn is_local(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

/// `word` quoted for the shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The hosts, backend and environment of an `mlx.launch` host file.
fn read_hostfile(path: &Path) -> anyhow::Result<(Vec<Host>, Option<Backend>, Vec<String>)> {
    let error = |message: String| anyhow::anyhow!("host file {}: {message}", path.display());
    let text = std::fs::read_to_string(path).map_err(|err| error(err.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|err| error(err.to_string()))?;
    let (hosts, backend, envs) = match &value {
        serde_json::Value::Array(hosts) => (hosts.clone(), None, Vec::new()),
        serde_json::Value::Object(fields) => {
            let hosts = fields
                .get("hosts")
                .and_then(|hosts| hosts.as_array())
                .ok_or_else(|| error("no \"hosts\" list".into()))?
                .clone();
            let backend = match fields.get("backend").and_then(|b| b.as_str()) {
                None | Some("") => None,
                Some(name) => Some(
                    name.parse::<Backend>()
                        .map_err(|err| error(err.to_string()))?,
                ),
            };
            let envs = match fields.get("envs") {
                None => Vec::new(),
                Some(envs) => serde_json::from_value(envs.clone())
                    .map_err(|err| error(format!("\"envs\": {err}")))?,
            };
            (hosts, backend, envs)
        }
        _ => {
            return Err(error(
                "expected a list of hosts or an object with \"hosts\"".into(),
            ))
        }
    };
    if hosts.is_empty() {
        return Err(error("no hosts".into()));
    }
    let hosts = hosts
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let ssh = host
                .get("ssh")
                .and_then(|ssh| ssh.as_str())
                .ok_or_else(|| error(format!("host {index} has no \"ssh\" name")))?;
            let ip = host
                .get("ips")
                .and_then(|ips| ips.as_array())
                .and_then(|ips| ips.first())
                .and_then(|ip| ip.as_str())
                .map(str::to_string);
            Ok(Host {
                ssh: ssh.into(),
                ip,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((hosts, backend, envs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_file_reads_as_mlx_launch_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts.json");
        std::fs::write(
            &path,
            r#"{"backend": "ring", "envs": ["A=1"], "hosts": [
                {"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": ["10.0.0.2"]}]}"#,
        )
        .unwrap();
        let (hosts, backend, envs) = read_hostfile(&path).unwrap();
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[1].ssh, "m2");
        assert_eq!(hosts[1].ip.as_deref(), Some("10.0.0.2"));
        assert_eq!(backend, Some(Backend::Ring));
        assert_eq!(envs, vec!["A=1".to_string()]);
        std::fs::write(&path, r#"[{"ips": ["10.0.0.1"]}]"#).unwrap();
        assert_eq!(
            read_hostfile(&path).unwrap_err().to_string(),
            format!("host file {}: host 0 has no \"ssh\" name", path.display())
        );
    }
}
