//! Attachments that outlive the process: links created with BPF_LINK_CREATE and pinned on the
//! bpffs. If `interceptor run` is killed, its programs stay attached and keep intercepting
//! (failing closed: never a moment in which the app reaches its destination around the proxy);
//! the next run of the same instance attaches its own programs first, then unpins these. aya 0.14
//! cannot pin every
//! link type we use (no `FdLink` for cgroup sockopt links), so this module makes them itself.
//!
//! A pin is never trusted: before the agent uses what is pinned at one of its link paths it reads
//! what it is (a link? of which hook? attached where? running one of our programs?) and compares
//! that with what it was asked to do. See [`PinnedLink::attach_or_update`].
use std::{
    fmt, io,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use interceptor_common::names;
use interceptor_sys::{LinkInfo, LinkTarget, ObjectKind, bpf_attach_type};
use tracing::warn;

/// A pinned object this agent will not use or replace, or a failed call on a pin.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{call} {path}: {source}")]
    Io {
        call: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "{path} holds {found}, where the agent keeps {expected}: it is not ours, so it is left \
         alone and not used. Remove it if nothing uses it, or use another --bpffs"
    )]
    NotOurs {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

fn io_error(call: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PinError {
    let path = path.to_owned();
    move |source| PinError::Io { call, path, source }
}

/// What a link attaches to, as the kernel identifies it in the link's info.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetId {
    /// A cgroup v2 by id: on cgroup2, the directory's inode number.
    Cgroup(u64),
    /// A network namespace by inode number.
    Netns(u32),
}

impl TargetId {
    fn of(target: LinkTarget) -> Option<Self> {
        match target {
            LinkTarget::Cgroup { id } => Some(Self::Cgroup(id)),
            LinkTarget::Netns { inode } => Some(Self::Netns(inode)),
            LinkTarget::Other { .. } => None,
        }
    }

    fn same_kind(self, other: Self) -> bool {
        matches!(
            (self, other),
            (Self::Cgroup(_), Self::Cgroup(_)) | (Self::Netns(_), Self::Netns(_))
        )
    }

    fn link_kind(self) -> &'static str {
        match self {
            Self::Cgroup(_) => "cgroup",
            Self::Netns(_) => "network namespace",
        }
    }
}

impl fmt::Display for TargetId {
    /// A cgroup by its path when it can be found under the cgroup2 mount, else by id.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cgroup(id) => match crate::cgroup::path_of_id(*id) {
                Some(path) => write!(f, "cgroup {}", path.display()),
                None => write!(f, "cgroup id {id}"),
            },
            Self::Netns(inode) => write!(f, "network namespace inode {inode}"),
        }
    }
}

/// A cgroup or network namespace to attach to: its fd, its identity and where it was opened.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub fd: BorrowedFd<'a>,
    pub id: TargetId,
    pub path: &'a Path,
}

impl<'a> Target<'a> {
    /// A cgroup v2 directory opened from `path`: its cgroup id is its inode number.
    pub fn cgroup(fd: BorrowedFd<'a>, path: &'a Path) -> io::Result<Self> {
        let stat = nix::sys::stat::fstat(fd)?;
        Ok(Self {
            fd,
            id: TargetId::Cgroup(stat.st_ino),
            path,
        })
    }

    /// A network namespace file opened from `path` (nsfs inode numbers are 32-bit).
    pub fn netns(fd: BorrowedFd<'a>, path: &'a Path) -> io::Result<Self> {
        let stat = nix::sys::stat::fstat(fd)?;
        Ok(Self {
            fd,
            id: TargetId::Netns(stat.st_ino as u32),
            path,
        })
    }
}

/// One of our links, found pinned where one is expected.
struct Found {
    fd: OwnedFd,
    info: LinkInfo,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Attached to the requested target.
    Here,
    /// Its cgroup or namespace is gone: it runs nowhere.
    Defunct,
    /// Attached to another target.
    Elsewhere(TargetId),
}

/// What is pinned at `path`: nothing, one of our links (a link of `attach_type` to a target of
/// `want`'s kind, running an `icpt_` program), or something that is not ours ([`PinError::NotOurs`]).
fn inspect(
    path: &Path,
    attach_type: bpf_attach_type,
    want: TargetId,
) -> Result<Option<Found>, PinError> {
    let Some(fd) = interceptor_sys::obj_get(path).map_err(io_error("opening the pin", path))?
    else {
        return Ok(None);
    };
    let expected = || {
        format!(
            "a {} link for {:?} running an {}* program",
            want.link_kind(),
            attach_type,
            names::PREFIX
        )
    };
    let not_ours = |found: String| PinError::NotOurs {
        path: path.to_owned(),
        found,
        expected: expected(),
    };
    let kind =
        interceptor_sys::object_kind(fd.as_fd()).map_err(io_error("reading the kind of", path))?;
    if kind != ObjectKind::Link {
        return Err(not_ours(kind.to_string()));
    }
    let info = interceptor_sys::link_info(fd.as_fd())
        .map_err(io_error("reading the link info of", path))?;
    let program = program_name(info.prog_id);
    let Some(target) = TargetId::of(info.target).filter(|t| t.same_kind(want)) else {
        return Err(not_ours(format!(
            "a link of another kind ({:?}) running {program}",
            info.target
        )));
    };
    if info.attach_type != attach_type as u32 {
        return Err(not_ours(format!(
            "a {} link of attach type {} running {program}",
            target.link_kind(),
            info.attach_type
        )));
    }
    if !program.starts_with(names::PREFIX) {
        return Err(not_ours(format!(
            "a {} link running program {program} (id {})",
            target.link_kind(),
            info.prog_id
        )));
    }
    let state = if info.target.is_defunct() {
        State::Defunct
    } else if target == want {
        State::Here
    } else {
        State::Elsewhere(target)
    };
    Ok(Some(Found { fd, info, state }))
}

/// The name of the program with kernel id `id`, or a placeholder that is no program's name.
fn program_name(id: u32) -> String {
    interceptor_sys::prog_fd_by_id(id)
        .and_then(|fd| interceptor_sys::prog_info(fd.as_fd()))
        .map_or_else(|e| format!("<program {id}: {e}>"), |info| info.name)
}

/// Where a new link is pinned before it is renamed over the one it replaces. No dot: bpffs
/// refuses names with one (EPERM, reserved).
fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push("_new");
    path.with_file_name(name)
}

/// A pinned link: dropping it unpins and closes it, which detaches the program, unless it is
/// persistent. A process that dies without dropping it leaves the program attached.
#[derive(Debug)]
pub struct PinnedLink {
    _fd: OwnedFd,
    path: PathBuf,
    /// Leave the pin (and so the attachment) in place on drop: the node agent's links outlive
    /// every agent process, and only `interceptor uninstall` removes them.
    persistent: bool,
}

impl PinnedLink {
    /// Attaches `program` to `target` (a cgroup or network namespace fd) and pins the link at
    /// `path`. Kernel >= 5.7 (cgroup links), 5.9 (sk_lookup links).
    pub fn attach(
        program: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach_type: bpf_attach_type,
        path: &Path,
    ) -> io::Result<Self> {
        let fd = interceptor_sys::link_create(program, target, attach_type)?;
        interceptor_sys::obj_pin(fd.as_fd(), path)?;
        Ok(Self {
            _fd: fd,
            path: path.to_owned(),
            persistent: false,
        })
    }

    /// Makes `program` the one run at `attach_type` for `target` through the link pinned at
    /// `path`, after checking what is pinned there (the link is persistent):
    ///
    /// - nothing: a new link is attached and pinned;
    /// - our link (same hook, an `icpt_` program), attached to `target`: its program is replaced
    ///   atomically (BPF_LINK_UPDATE: no moment without a program on the hook);
    /// - our link, defunct (its cgroup or namespace is gone; ENOLINK on update): a new link
    ///   replaces it;
    /// - our link attached to another cgroup or namespace: a new link is attached to `target`
    ///   first, then the pin is replaced, which releases the old attachment, so a process covered
    ///   by both never runs without our program;
    /// - anything else: [`PinError::NotOurs`], and nothing is changed.
    ///
    /// A temporary pin left by a crash in the middle of a replacement is removed first, if it is
    /// ours. Kernel >= 5.8 (link info).
    pub fn attach_or_update(
        program: BorrowedFd<'_>,
        target: Target<'_>,
        attach_type: bpf_attach_type,
        path: &Path,
    ) -> Result<Self, PinError> {
        // A leftover must be ours to be removed; it goes once the new link is in place (it may
        // be all that still intercepts in `target`).
        let temporary = temporary_path(path);
        let leftover = inspect(&temporary, attach_type, target.id)?.is_some();
        let fd = match inspect(path, attach_type, target.id)? {
            None => {
                let fd = interceptor_sys::link_create(program, target.fd, attach_type)
                    .map_err(io_error("attaching a link for", path))?;
                interceptor_sys::obj_pin(fd.as_fd(), path).map_err(io_error("pinning", path))?;
                fd
            }
            Some(found) => match found.state {
                State::Here => match interceptor_sys::link_update(found.fd.as_fd(), program) {
                    Ok(()) => found.fd,
                    // Its target went away since it was inspected.
                    Err(e) if e.raw_os_error() == Some(libc::ENOLINK) => replace(
                        program,
                        target,
                        attach_type,
                        path,
                        &found,
                        "its target is gone",
                    )?,
                    Err(e) => return Err(io_error("updating the link pinned at", path)(e)),
                },
                State::Defunct => replace(
                    program,
                    target,
                    attach_type,
                    path,
                    &found,
                    "its cgroup or network namespace is gone",
                )?,
                State::Elsewhere(_) => replace(
                    program,
                    target,
                    attach_type,
                    path,
                    &found,
                    "it was attached elsewhere",
                )?,
            },
        };
        if leftover {
            Self::remove_pinned(&temporary)?;
        }
        Ok(Self {
            _fd: fd,
            path: path.to_owned(),
            persistent: true,
        })
    }

    /// Pins this persistent link again if its pin was removed while this process held it:
    /// without the pin, the attachment would end with this process. Something else pinned at
    /// the path meanwhile is left alone (the health check reports it). Returns whether it
    /// pinned.
    pub fn restore_pin(&self) -> io::Result<bool> {
        if !self.persistent || self.path.symlink_metadata().is_ok() {
            return Ok(false);
        }
        interceptor_sys::obj_pin(self._fd.as_fd(), &self.path)?;
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unpins and detaches the link pinned at `path`, if any and if it is ours (a removed pod,
    /// `interceptor uninstall`). The program stops running once no process holds the link
    /// either.
    pub fn remove_pinned(path: &Path) -> Result<(), PinError> {
        remove_ours(path).map(drop)
    }
}

/// Unpins what is pinned at `path` if it is ours: one of our links (running an `icpt_`
/// program) or one of our maps (named as its pin, within the kernel's 15 characters). Anything
/// else is left in place: [`PinError::NotOurs`]. Returns whether something was removed.
pub fn remove_ours(path: &Path) -> Result<bool, PinError> {
    let Some(fd) = interceptor_sys::obj_get(path).map_err(io_error("opening the pin", path))?
    else {
        return Ok(false);
    };
    let kind =
        interceptor_sys::object_kind(fd.as_fd()).map_err(io_error("reading the kind of", path))?;
    let pinned_as = path.file_name().unwrap_or_default().to_string_lossy();
    let ours = match kind {
        ObjectKind::Link => {
            let info = interceptor_sys::link_info(fd.as_fd())
                .map_err(io_error("reading the link info of", path))?;
            let program = program_name(info.prog_id);
            program
                .starts_with(names::PREFIX)
                .then_some(())
                .ok_or(format!("a link running program {program}"))
        }
        ObjectKind::Map => {
            let info = interceptor_sys::map_info(fd.as_fd())
                .map_err(io_error("reading the map info of", path))?;
            let expected: String = pinned_as.chars().take(15).collect();
            (info.name == expected)
                .then_some(())
                .ok_or(format!("a map named {:?}", info.name))
        }
        other => Err(other.to_string()),
    };
    if let Err(found) = ours {
        return Err(PinError::NotOurs {
            path: path.to_owned(),
            found,
            expected: format!("one of its own links or maps named {pinned_as}"),
        });
    }
    drop(fd);
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("unpinning", path)(e)),
    }
}

/// Attaches a new link to `target`, then puts it in `old`'s place at `path`: pinned at a
/// temporary name in the same directory, then renamed over the old pin, so `path` always holds a
/// link (bpffs supports rename(2) over an existing pin: tested on 6.18, and the kernel has had
/// `simple_rename` in bpffs' directory operations since 4.11). The old link detaches once its
/// last fd, `old.fd`, is closed by the caller.
fn replace(
    program: BorrowedFd<'_>,
    target: Target<'_>,
    attach_type: bpf_attach_type,
    path: &Path,
    old: &Found,
    why: &str,
) -> Result<OwnedFd, PinError> {
    let fd = interceptor_sys::link_create(program, target.fd, attach_type)
        .map_err(io_error("attaching a link for", path))?;
    // A leftover temporary pin was found to be ours before this was called.
    let temporary = temporary_path(path);
    PinnedLink::remove_pinned(&temporary)?;
    interceptor_sys::obj_pin(fd.as_fd(), &temporary).map_err(io_error("pinning", &temporary))?;
    if let Err(e) = std::fs::rename(&temporary, path) {
        let _ = std::fs::remove_file(&temporary);
        return Err(io_error("replacing the pin", path)(e));
    }
    let from = match old.state {
        State::Elsewhere(id) => id.to_string(),
        State::Here | State::Defunct => format!("a {} that is gone", target.id.link_kind()),
    };
    warn!(
        link = %path.display(),
        from = %from,
        to = %target.path.display(),
        old_link_id = old.info.id,
        reason = why,
        "moved a pinned link: attached to the requested target first, then replaced the pin"
    );
    Ok(fd)
}

impl Drop for PinnedLink {
    /// Unpins; closing `fd` right after releases the last reference and detaches. A persistent
    /// link keeps its pin, and stays attached.
    fn drop(&mut self) {
        if !self.persistent {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Something wrong with one of the node's pinned links, as [`check`] finds it without changing
/// anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkProblem {
    Missing {
        path: PathBuf,
    },
    /// Its cgroup or namespace is gone: it intercepts nothing.
    Defunct {
        path: PathBuf,
    },
    /// Attached to another cgroup or namespace than configured.
    Elsewhere {
        path: PathBuf,
        expected: String,
        found: String,
    },
    /// Runs a program other than the one this agent loaded for it.
    OtherProgram {
        path: PathBuf,
        expected_id: u32,
        found: String,
    },
    /// Not one of our links at all.
    NotOurs {
        path: PathBuf,
        found: String,
    },
    Unreadable {
        path: PathBuf,
        error: String,
    },
}

impl fmt::Display for LinkProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { path } => write!(f, "{}: no link pinned", path.display()),
            Self::Defunct { path } => write!(
                f,
                "{}: defunct (its cgroup or network namespace is gone)",
                path.display()
            ),
            Self::Elsewhere {
                path,
                expected,
                found,
            } => write!(
                f,
                "{}: attached to {found}, not to {expected}",
                path.display()
            ),
            Self::OtherProgram {
                path,
                expected_id,
                found,
            } => write!(
                f,
                "{}: runs {found}, not this agent's program (id {expected_id})",
                path.display()
            ),
            Self::NotOurs { path, found } => {
                write!(f, "{}: holds {found}, not one of our links", path.display())
            }
            Self::Unreadable { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

/// What is wrong, if anything, with the link pinned at `path`, which should attach program
/// `program_id` at `attach_type` to `want`. Reads only.
pub fn check(
    path: &Path,
    attach_type: bpf_attach_type,
    want: TargetId,
    program_id: u32,
) -> Option<LinkProblem> {
    let path = path.to_owned();
    match inspect(&path, attach_type, want) {
        Ok(None) => Some(LinkProblem::Missing { path }),
        Ok(Some(found)) => match found.state {
            State::Defunct => Some(LinkProblem::Defunct { path }),
            State::Elsewhere(id) => Some(LinkProblem::Elsewhere {
                path,
                expected: want.to_string(),
                found: id.to_string(),
            }),
            State::Here if found.info.prog_id != program_id => Some(LinkProblem::OtherProgram {
                path,
                expected_id: program_id,
                found: format!(
                    "{} (id {})",
                    program_name(found.info.prog_id),
                    found.info.prog_id
                ),
            }),
            State::Here => None,
        },
        Err(PinError::NotOurs { found, .. }) => Some(LinkProblem::NotOurs { path, found }),
        Err(e) => Some(LinkProblem::Unreadable {
            path,
            error: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_pin_is_a_sibling_without_a_dot() {
        let path = temporary_path(Path::new("/sys/fs/bpf/x/link_icpt_connect4"));
        assert_eq!(path, Path::new("/sys/fs/bpf/x/link_icpt_connect4_new"));
    }

    #[test]
    fn problems_name_the_path_and_both_places() {
        let problem = LinkProblem::Elsewhere {
            path: "/b/link_icpt_connect4".into(),
            expected: "cgroup /a".into(),
            found: "cgroup id 7".into(),
        };
        assert_eq!(
            problem.to_string(),
            "/b/link_icpt_connect4: attached to cgroup id 7, not to cgroup /a"
        );
    }
}
