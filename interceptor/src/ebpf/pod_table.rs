//! The eBPF backend of the node's pod table ([`EbpfNode`] as an [`Interception`]), and what
//! only a table of eBPF pods can tell or do: counters, listeners, pins, leftovers in the maps.
use std::path::{Path, PathBuf};

use interceptor_common::{NetnsCookie, PodSlot};

use super::{Counters, EbpfError, EbpfNode, EbpfWritten, InMaps, LoadOptions, ProgramState};
use crate::{
    netns::{
        LocalDestinations, NetnsError, PodNetns,
        listener::{Listening, find_listeners},
    },
    node::{Adopted, Interception, Pod, PodTable, Wanted},
};

/// The pods one eBPF node attachment serves, with a `F` of their user's each (the agent's facts;
/// nothing for `interceptor run` and the tests).
pub type EbpfPods<F = ()> = PodTable<EbpfNode, F>;

impl Interception for EbpfNode {
    type Written = EbpfWritten;
    type Error = EbpfError;
    type Census = InMaps;

    /// The netns cookie, which the programs read in the kernel (Linux 5.14; before,
    /// [`NetnsError::NoCookie`]).
    fn key(netns: &PodNetns) -> Result<NetnsCookie, NetnsError> {
        netns.cookie()
    }

    fn identify(netns: &PodNetns) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
        netns.cookie_and_local()
    }

    /// The counter slots decide ([`EbpfError::NoFreeSlot`]).
    fn room(&self, _meshed: usize) -> Result<(), EbpfError> {
        Ok(())
    }

    /// Make before break: a change that fails leaves the maps exactly as they were.
    fn write(
        &mut self,
        key: NetnsCookie,
        wanted: &Wanted<'_>,
        before: Option<&mut Pod<EbpfWritten>>,
    ) -> Result<EbpfWritten, EbpfError> {
        match before {
            None => self.pod_writer_mut().write_new(key, wanted),
            Some(before) => self.pod_writer_mut().update(key, wanted, before),
        }
    }

    fn set_local(
        &mut self,
        key: NetnsCookie,
        pod: &mut Pod<EbpfWritten>,
        local: &LocalDestinations,
    ) -> Result<(), EbpfError> {
        self.pod_writer_mut().set_local(key, pod, local)
    }

    fn remove(&mut self, key: NetnsCookie, pod: &mut Pod<EbpfWritten>) -> Result<(), EbpfError> {
        self.pod_writer_mut().remove(key, &mut pod.written)
    }

    /// The maps outlive the namespace: its entries are removed as for [`Self::remove`].
    fn forget(&mut self, key: NetnsCookie, pod: &mut Pod<EbpfWritten>) -> Result<(), EbpfError> {
        self.pod_writer_mut().remove(key, &mut pod.written)
    }

    fn problem(&self, key: NetnsCookie, pod: &Pod<EbpfWritten>) -> Option<String> {
        self.pod_writer().problem(key, pod)
    }

    fn census(&self) -> InMaps {
        self.pod_writer().in_maps()
    }

    /// The pod's subnet entries in `census` against those written (its configuration entry,
    /// with its addresses, is [`Self::problem`]'s).
    fn differs(
        &self,
        key: NetnsCookie,
        pod: &Pod<EbpfWritten>,
        census: Option<&InMaps>,
    ) -> Option<String> {
        self.pod_writer().entries_differ(key, &pod.written, census?)
    }

    /// Nothing of what eBPF writes is recorded: the maps and pins are read back.
    fn adopt(
        &mut self,
        key: NetnsCookie,
        wanted: &Wanted<'_>,
        _recorded: Option<&EbpfWritten>,
        census: &mut InMaps,
    ) -> Result<Adopted<EbpfWritten>, EbpfError> {
        self.pod_writer_mut().restore(key, wanted, census)
    }
}

impl<F> PodTable<EbpfNode, F> {
    /// Loads the node's programs and maps (see [`EbpfNode::load`]); no pod yet.
    pub fn load(options: LoadOptions) -> Result<Self, EbpfError> {
        EbpfNode::load(options).map(Self::new)
    }

    /// Attaches every program to `cgroup` (see [`EbpfNode::attach`]).
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), EbpfError> {
        self.backend_mut().attach(cgroup)
    }

    /// Registers a pod with `facts` and adopts its proxy's inbound listener if it already
    /// listens: all of it, or nothing. Returns its counter slot.
    pub fn add(
        &mut self,
        key: NetnsCookie,
        path: &Path,
        wanted: &Wanted<'_>,
        facts: F,
    ) -> Result<PodSlot, EbpfError> {
        let is_new = !self.contains(key);
        self.write(key, path, wanted, facts)?;
        let found = find_listeners(wanted.netns, wanted.config.incoming_proxy_port);
        self.adopt_listeners_or_undo(key, found, is_new)?;
        Ok(self.slot(key).expect("a pod just written is in the table"))
    }

    /// Adopts the listeners `found` for a pod just written (see [`Self::adopt_listeners`]).
    /// A pod that cannot have them would drop inbound connections: if it is new (`is_new`), it
    /// is removed again; a pod written before stays as it was. The one place of this policy:
    /// `add` and the agent's registration and take-over of iptables pods all come here.
    pub fn adopt_listeners_or_undo(
        &mut self,
        key: NetnsCookie,
        found: Vec<Listening>,
        is_new: bool,
    ) -> Result<(), EbpfError> {
        let adopted = self.adopt_listeners(key, found);
        if adopted.is_err() && is_new {
            let _ = self.remove(key);
        }
        adopted
    }

    /// Puts the listeners of a registered pod's proxy that existed before it was registered
    /// (found with [`find_listeners`], best without holding whatever guards the table) into the
    /// listener map. A pod no longer registered is left alone.
    pub fn adopt_listeners(
        &mut self,
        key: NetnsCookie,
        found: Vec<Listening>,
    ) -> Result<(), EbpfError> {
        if !self.contains(key) {
            return Ok(());
        }
        self.backend_mut()
            .pod_writer_mut()
            .adopt_listeners(key, found)
    }

    /// Removes everything the maps and pins hold for a pod: through the table if it is
    /// registered, else what an earlier process left of it.
    pub fn purge(&mut self, key: NetnsCookie) -> Result<(), EbpfError> {
        if self.contains(key) {
            return self.remove(key).map(drop);
        }
        self.backend_mut().pod_writer_mut().purge(key)
    }

    /// A registered pod's counter slot.
    pub fn slot(&self, key: NetnsCookie) -> Option<PodSlot> {
        Some(self.get(key)?.pod.written.slot())
    }

    /// A registered pod's counters, summed over CPUs (`None`: not registered).
    pub fn counters(&self, key: NetnsCookie) -> Result<Option<Counters>, EbpfError> {
        let Some(slot) = self.slot(key) else {
            return Ok(None);
        };
        self.backend().pod_writer().counters(slot).map(Some)
    }

    /// Whether the pod's proxy is listening, in either family (see
    /// [`super::PodWriter::has_listener`]).
    pub fn has_listener(&self, key: NetnsCookie) -> bool {
        self.backend().pod_writer().has_listener(key)
    }

    /// The pod's own sk_lookup program instance, as `status` reports it.
    pub fn inbound_program(&self, key: NetnsCookie) -> Option<ProgramState> {
        self.get(key)?.pod.written.inbound_program()
    }

    /// The pods the maps (`in_maps`: the subnet entries, read once) or the pins hold something
    /// of, registered or not: those not registered are what a registration or a removal cut
    /// short left behind.
    pub fn held(&self, in_maps: &InMaps) -> Vec<NetnsCookie> {
        let maps = self.backend().pod_writer();
        maps.cookies_in_maps()
            .into_iter()
            .chain(in_maps.cookies())
            .chain(maps.pinned_inbound_cookies())
            .collect()
    }

    /// Pins again the links (the node's and each pod's sk_lookup link) whose pins were removed
    /// while this process held them, so the attachments outlive it as they should. Returns the
    /// paths pinned again, and those that could not be.
    pub fn restore_missing_pins(&self) -> (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>) {
        let (mut pinned, mut failed) = (Vec::new(), Vec::new());
        let pods = self
            .iter()
            .filter_map(|(_, e)| e.pod.written.inbound_link());
        for link in self.backend().attached.links().iter().chain(pods) {
            match link.restore_pin() {
                Ok(true) => pinned.push(link.path().to_owned()),
                Ok(false) => {}
                Err(e) => failed.push((link.path().to_owned(), e)),
            }
        }
        (pinned, failed)
    }
}
