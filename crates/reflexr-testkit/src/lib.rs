//! The environment the integration tests of every crate in the workspace
//! share (not published). One environment, generic over the backend:
//! [`backend::TestBackend`] gives each backend a place of the test's own
//! (`Place`) and the application's SQL in its dialect, and the
//! `on_backends!` tests run on each. SQLite's place is a [`Scene`] (a temp
//! directory, its `test.db` and a manual clock), which the tests of what
//! only a file has — opening and migrating files, power cuts, the surfaces
//! — use directly. Besides: the [`Arrange`] steps that put an engine in the
//! state a test starts from, and child processes ([`Scene::child`],
//! [`backend::child`], [`Watched`]).

pub mod backend;
pub mod channels;
pub mod http;
pub mod inputs;
pub mod power;
pub mod rules;
pub mod shop;
pub mod torture;
pub mod workflow;

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use reflexr::{Builder, Engine, ManualClock, NewEvent};

/// Runs each generic test — `fn name<B: TestBackend>()` — on SQLite and,
/// with the feature `postgres`, on PostgreSQL: the tests `name::sqlite` and
/// `name::postgres`.
#[macro_export]
macro_rules! on_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name::<reflexr::Sqlite>();
                }
                #[cfg(feature = "postgres")]
                #[test]
                fn postgres() {
                    super::$name::<reflexr::Postgres>();
                }
            }
        )*
    };
}

/// The child side of a test that starts processes, written once —
/// `fn name<B: TestBackend>()` — and entered by a child that
/// [`backend::child`] started for its backend; in a test run of its own it
/// does nothing.
#[macro_export]
macro_rules! children_on_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    if $crate::is_child() {
                        super::$name::<reflexr::Sqlite>();
                    }
                }
                #[cfg(feature = "postgres")]
                #[test]
                fn postgres() {
                    if $crate::is_child() {
                        super::$name::<reflexr::Postgres>();
                    }
                }
            }
        )*
    };
}

/// The round, recognisable time a new scene's clock starts at.
const ROUND_MS: i64 = 1_800_000_000_000;

/// A test's own file and clock: a temp directory (removed when the scene is
/// dropped), the file `test.db` in it, and a manual clock that every engine
/// the scene opens shares, so the test moves time for all of them at once.
pub struct Scene {
    dir: tempfile::TempDir,
    /// The test's file, `test.db` in the scene's directory.
    pub path: PathBuf,
    /// The clock of every engine opened through the scene.
    pub clock: ManualClock,
}

impl Default for Scene {
    fn default() -> Self {
        Scene::new()
    }
}

impl Scene {
    /// A new scene whose clock stands at a round time (1_800_000_000_000 ms),
    /// so times in assertions are recognisable.
    pub fn new() -> Scene {
        Scene::with_clock(ManualClock::new(ROUND_MS))
    }

    /// A new scene whose clock starts at the present, for a test whose file
    /// is also used on the system clock (a child process, `Engine::open`):
    /// leases and due times then mean the same on both clocks.
    pub fn starting_now() -> Scene {
        Scene::with_clock(ManualClock::starting_now())
    }

    fn with_clock(clock: ManualClock) -> Scene {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("test.db");
        Scene { dir, path, clock }
    }

    /// Another file beside the test's own (a hub, a second database),
    /// removed with the scene.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A builder on the scene's file, for a test that needs more settings
    /// than [`Scene::open`] gives: the scene's clock, `holder` as the lease
    /// holder id, and a busy timeout of 20 s, short enough that a bug shows
    /// as an error rather than a long hang.
    pub fn builder(&self, holder: &str) -> Builder {
        self.builder_at(&self.path, holder)
    }

    /// An engine on the scene's file, as [`Scene::builder`] sets it up.
    pub fn open(&self, holder: &str) -> Engine {
        self.open_at(&self.path, holder)
    }

    /// An engine on another file (see [`Scene::file`]) with the scene's
    /// settings, as [`Scene::builder`] sets them.
    pub fn open_at(&self, path: &Path, holder: &str) -> Engine {
        self.builder_at(path, holder).open().expect("open engine")
    }

    fn builder_at(&self, path: &Path, holder: &str) -> Builder {
        Engine::builder(path)
            .clock(self.clock.clone())
            .holder_id(holder)
            .busy_timeout(Duration::from_secs(20))
    }

    /// Starts the child test `entry` (see [`spawn_child`]) on the scene's
    /// file — it finds it with [`parent_file`] — with `vars` besides, and
    /// reads its output.
    pub fn child(&self, entry: &str, vars: &[(&str, String)]) -> Watched {
        let mut all = vec![("REFLEXR_DB", self.path.to_string_lossy().into_owned())];
        all.extend(vars.iter().cloned());
        Watched::new(spawn_child(entry, &all))
    }
}

/// A clock `hours` after a new scene's: for a child process or a later
/// engine that must find every lease taken before it lapsed.
pub fn later(hours: i64) -> ManualClock {
    ManualClock::new(ROUND_MS + hours * 3_600_000)
}

/// The steps that put an engine in the state a test starts from, chained
/// after [`Scene::open`]: each takes the engine, does one thing, and hands
/// the engine back, so a test arranges in one line, e.g.
/// `s.open("test").workspace("app", TYPES).sql(TABLES)`.
pub trait Arrange: Sized {
    /// Ensures the workspace `name` with (at least) these event types.
    fn workspace(self, name: &str, types: &[&str]) -> Self;
    /// Ensures each `(name, types)` workspace in turn: the workspaces a
    /// file's tests all need, kept as one constant.
    fn each_workspace(self, list: &[(&str, &[&str])]) -> Self;
    /// Appends `events` to `workspace`, each in its own commit: the log a
    /// test starts from.
    fn events(self, workspace: &str, events: impl IntoIterator<Item = NewEvent>) -> Self;
    /// Runs the application's own SQL (its tables and rows) in one write.
    fn sql(self, sql: &str) -> Self;
    /// Registers the action `name` with a handler that does nothing, for
    /// rules whose runs only need to end.
    fn noop(self, name: &str) -> Self;
}

impl Arrange for Engine {
    fn workspace(self, name: &str, types: &[&str]) -> Self {
        self.ensure_workspace(name, types)
            .expect("ensure workspace");
        self
    }

    fn each_workspace(self, list: &[(&str, &[&str])]) -> Self {
        list.iter()
            .fold(self, |e, (name, types)| e.workspace(name, types))
    }

    fn events(self, workspace: &str, events: impl IntoIterator<Item = NewEvent>) -> Self {
        for event in events {
            self.append(workspace, &event).expect("append");
        }
        self
    }

    fn sql(self, sql: &str) -> Self {
        self.write(|tx| Ok(tx.conn().execute_batch(sql)?))
            .expect("the application's SQL");
        self
    }

    fn noop(self, name: &str) -> Self {
        self.register_action(name, |_, _| Ok(()))
            .expect("register action");
        self
    }
}

/// Counts rows of a query's single integer column.
pub fn count(engine: &Engine, sql: &str) -> i64 {
    engine
        .with_reader(|c| Ok(c.query_row(sql, [], |r| r.get(0))?))
        .expect("count")
}

/// Starts this test binary again as a child process that runs only the test
/// `entry`, with `vars` in its environment. The entry test does its child's
/// work when it finds `REFLEXR_CHILD` set, and nothing otherwise.
///
/// `entry` is the test's name within its module (`child_appends`, or
/// `child_appends::sqlite` for one written with `children_on_backends!`):
/// the binary holds every module's tests, so the one test whose full name
/// ends with it is found in the binary's list, and run alone (`--exact`).
pub fn spawn_child(entry: &str, vars: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let name = full_test_name(&exe, entry);
    let mut cmd = Command::new(exe);
    cmd.args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env("REFLEXR_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// The full name of the one test in the binary `exe` named `entry` within
/// its module. Panics when none or several are.
fn full_test_name(exe: &Path, entry: &str) -> String {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    let list = LIST.get_or_init(|| {
        let out = Command::new(exe)
            .args(["--list", "--format", "terse"])
            .env_remove("REFLEXR_CHILD")
            .output()
            .expect("list the test binary's tests");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_owned)
            .collect()
    });
    let suffix = format!("::{entry}");
    let found: Vec<&String> = list
        .iter()
        .filter(|n| *n == entry || n.ends_with(&suffix))
        .collect();
    match found.as_slice() {
        [one] => (*one).clone(),
        [] => panic!("no test named {entry} in {}", exe.display()),
        many => panic!("several tests named {entry}: {many:?}"),
    }
}

/// True inside a child started by [`spawn_child`].
pub fn is_child() -> bool {
    std::env::var_os("REFLEXR_CHILD").is_some()
}

/// Inside a child started by [`Scene::child`]: the parent scene's file.
pub fn parent_file() -> PathBuf {
    std::env::var_os("REFLEXR_DB")
        .expect("REFLEXR_DB, set by Scene::child")
        .into()
}

/// A child process and its standard output, read line by line: the test
/// waits for the line that says the child got where it should, then lets it
/// finish or kills it, and looks at what it printed meanwhile.
pub struct Watched {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Waits, once the child has exited, until whatever it left running
    /// elsewhere has ended too (its sessions on a database server).
    gone: Option<Box<dyn FnOnce() + Send>>,
}

/// How a [`Watched`] child ended.
pub struct Ended {
    /// Whether it exited by itself and successfully.
    pub success: bool,
    /// The lines it printed after those the test had read.
    pub rest: Vec<String>,
}

impl Watched {
    /// Watches `child`, which was spawned with its stdout piped.
    pub fn new(mut child: Child) -> Watched {
        let out = child.stdout.take().expect("the child's stdout is piped");
        Watched {
            child,
            lines: BufReader::new(out).lines(),
            gone: None,
        }
    }

    /// Makes [`Watched::kill`] and [`Watched::finish`] call `gone` after
    /// the child has exited, before they return: a killed client's server
    /// session may still finish the statement (a `COMMIT`) it had received,
    /// and a check that reads the database in several statements must not
    /// see it land halfway.
    pub fn on_gone(mut self, gone: impl FnOnce() + Send + 'static) -> Watched {
        self.gone = Some(Box::new(gone));
        self
    }

    /// Reads lines until `find` returns something for one, and returns that;
    /// `None` if the output ended first.
    pub fn until<T>(&mut self, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
        self.lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| find(&l))
    }

    /// Reads lines up to and including one ending with `marker`; false if the
    /// output ended first.
    pub fn past(&mut self, marker: &str) -> bool {
        self.until(|l| l.ends_with(marker).then_some(())).is_some()
    }

    /// Writes `text` to the child's stdin.
    pub fn send(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().expect("the child's stdin");
        stdin
            .write_all(text.as_bytes())
            .expect("write to the child");
    }

    /// Closes the child's stdin (which tells some children to stop).
    pub fn hang_up(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Kills the child (if it has not ended already) and collects the rest of
    /// its output.
    pub fn kill(mut self) -> Ended {
        let _ = self.child.kill();
        self.finish()
    }

    /// Reads the child's output to its end, then waits for it to exit.
    pub fn finish(mut self) -> Ended {
        let rest = self.lines.by_ref().map_while(Result::ok).collect();
        let success = self.child.wait().expect("wait for the child").success();
        if let Some(gone) = self.gone.take() {
            gone();
        }
        Ended { success, rest }
    }
}

/// A child the test did not end (it failed first) is killed, not left
/// running.
impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A file's bytes, to prove a refused open left it unchanged.
pub fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read file")
}
