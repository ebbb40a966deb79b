//! The addresses of the calling thread's network namespace, from one rtnetlink `RTM_GETADDR`
//! dump. `getifaddrs(3)` dumps every link with its statistics as well, which cost a pod's
//! registration more than the addresses themselves (a tenth of it, in `perf`).
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd as _,
};

use interceptor_sys::netns::{recv, route_socket, send};

const NLMSG_HDRLEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;

/// Every address assigned to an interface of the namespace, both families, loopback and
/// link-local included, as `getifaddrs` names them (`IFA_LOCAL`, else `IFA_ADDRESS`).
pub(super) fn dump() -> io::Result<Vec<IpAddr>> {
    let fd = route_socket(0)?;

    // nlmsghdr (len, type, flags, seq, pid) + ifaddrmsg (family AF_UNSPEC: both).
    let mut request = [0u8; NLMSG_HDRLEN + IFADDRMSG_LEN];
    request[0..4].copy_from_slice(&((NLMSG_HDRLEN + IFADDRMSG_LEN) as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&libc::RTM_GETADDR.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    send(fd.as_fd(), &request)?;

    let mut addresses = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_fd(), &mut buf)?;
        if parse(&buf[..n], &mut addresses)? {
            return Ok(addresses);
        }
    }
}

/// Parses one datagram of the dump into `addresses`; true once the dump is done.
fn parse(mut data: &[u8], addresses: &mut Vec<IpAddr>) -> io::Result<bool> {
    let u16_at = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(io::Error::other("truncated rtnetlink message"));
        }
        let message = &data[..len];
        match u16_at(message, 4) {
            t if t == libc::NLMSG_DONE as u16 => return Ok(true),
            t if t == libc::NLMSG_ERROR as u16 => {
                let errno = i32::from_ne_bytes(message[16..20].try_into().expect("4 bytes"));
                return Err(io::Error::from_raw_os_error(-errno));
            }
            libc::RTM_NEWADDR if len >= NLMSG_HDRLEN + IFADDRMSG_LEN => {
                let family = i32::from(message[NLMSG_HDRLEN]);
                let (mut local, mut address) = (None, None);
                let mut attrs = &message[NLMSG_HDRLEN + IFADDRMSG_LEN..];
                while attrs.len() >= 4 {
                    let attr_len = usize::from(u16_at(attrs, 0));
                    if attr_len < 4 || attr_len > attrs.len() {
                        break;
                    }
                    let value = &attrs[4..attr_len];
                    let ip = match (family, value.len()) {
                        (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::from(
                            <[u8; 4]>::try_from(value).expect("4 bytes"),
                        ))),
                        (libc::AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(
                            <[u8; 16]>::try_from(value).expect("16 bytes"),
                        ))),
                        _ => None,
                    };
                    match u16_at(attrs, 2) {
                        libc::IFA_LOCAL => local = ip,
                        libc::IFA_ADDRESS => address = ip,
                        _ => {}
                    }
                    attrs = &attrs[((attr_len + 3) & !3).min(attrs.len())..];
                }
                addresses.extend(local.or(address));
            }
            _ => {}
        }
        data = &data[((len + 3) & !3).min(data.len())..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend(((4 + value.len()) as u16).to_ne_bytes());
        a.extend(kind.to_ne_bytes());
        a.extend(value);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    #[test]
    fn local_wins_over_address_and_both_families_parse() {
        let mut v4 = vec![libc::AF_INET as u8, 24, 0, 0, 2, 0, 0, 0];
        v4.extend(attr(libc::IFA_ADDRESS, &[10, 0, 0, 2]));
        v4.extend(attr(libc::IFA_LOCAL, &[10, 0, 0, 1]));
        let mut v6 = vec![libc::AF_INET6 as u8, 64, 0, 0, 2, 0, 0, 0];
        let fd77 = "fd77::1".parse::<Ipv6Addr>().unwrap().octets();
        v6.extend(attr(libc::IFA_ADDRESS, &fd77));
        let mut data = message(libc::RTM_NEWADDR, &v4);
        data.extend(message(libc::RTM_NEWADDR, &v6));
        data.extend(message(libc::NLMSG_DONE as u16, &[0; 4]));
        let mut addresses = Vec::new();
        assert!(parse(&data, &mut addresses).unwrap());
        assert_eq!(
            addresses,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd77::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn an_error_message_is_an_error() {
        let data = message(libc::NLMSG_ERROR as u16, &(-libc::EPERM).to_ne_bytes());
        let err = parse(&data, &mut Vec::new()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn a_truncated_message_is_an_error() {
        let mut data = message(
            libc::RTM_NEWADDR,
            &[libc::AF_INET as u8, 0, 0, 0, 0, 0, 0, 0],
        );
        data.truncate(10);
        data[0] = 200;
        assert!(parse(&data, &mut Vec::new()).is_ok());
        let mut data = message(libc::RTM_NEWADDR, &[0; 8]);
        data[0] = 200;
        assert!(parse(&data, &mut Vec::new()).is_err());
    }
}
