//! proxy-init's flags, valid and not, and what each gives: the one table every reader of them
//! runs, the configuration crate's parser, `interceptor run` and `pod add` in the CLI's tests,
//! and the CNI plugin's `linkerd` block (the cases written as `--name=value` only, which map
//! onto its keys) in the plugin's tests.

/// One case: the flags, and either the configuration they give as
/// `InterceptionConfig::to_args` writes it (space-separated) or a piece of the error.
pub type FlagCase = (&'static [&'static str], Result<&'static str, &'static str>);

const MINIMAL: &str = "--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --ipv6=true";
const NO_IPV6: &str = "--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --ipv6=false";

pub const FLAG_CASES: &[FlagCase] = &[
    (&["-p", "4143", "-o", "4140"], Ok(MINIMAL)),
    (
        &["--incoming-proxy-port=4143", "--outgoing-proxy-port=4140"],
        Ok(MINIMAL),
    ),
    // pflag takes a short flag's value attached or after `=`.
    (&["-p4143", "-o=4140"], Ok(MINIMAL)),
    // The flags Linkerd's injector gives proxy-init.
    (
        &[
            "--incoming-proxy-port",
            "4143",
            "--outgoing-proxy-port",
            "4140",
            "--proxy-uid",
            "2102",
            "--inbound-ports-to-ignore",
            "4190,4191,4567,4568",
            "--outbound-ports-to-ignore",
            "443,6443",
        ],
        Ok(
            "--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --proxy-uid 2102 \
            --inbound-ports-to-ignore 4190,4191,4567,4568 --outbound-ports-to-ignore 443,6443 \
            --ipv6=true",
        ),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-uid=2102",
            "--proxy-gid=2103",
            "--inbound-ports-to-ignore=4190, 25-30",
            "--outbound-ports-to-ignore=",
            "--ports-to-redirect=80,8080",
            "--subnets-to-ignore=10.1.2.3/8,fd00::1/8",
            "--outbound-subnets-to-ignore=192.0.2.7",
            "--ipv6=false",
        ],
        Ok(
            "--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --proxy-uid 2102 \
            --proxy-gid 2103 --inbound-ports-to-ignore 4190,25-30 --ports-to-redirect 80,8080 \
            --subnets-to-ignore 10.0.0.0/8,fd00::/8 --outbound-subnets-to-ignore 192.0.2.7/32 \
            --ipv6=false",
        ),
    ),
    // A list flag's values add up; empty entries are skipped.
    (
        &[
            "-p",
            "4143",
            "-o",
            "4140",
            "-r",
            "80,8080",
            "-r",
            "9090",
            "--outbound-ports-to-ignore",
            "",
            "--outbound-ports-to-ignore",
            "25-30,,22",
            "--subnets-to-ignore",
            "10.0.0.0/8,192.0.2.1",
            "--subnets-to-ignore=198.51.100.0/24",
        ],
        Ok("--incoming-proxy-port 4143 --outgoing-proxy-port 4140 \
            --outbound-ports-to-ignore 25-30,22 --ports-to-redirect 80,8080,9090 \
            --subnets-to-ignore 10.0.0.0/8,192.0.2.1/32,198.51.100.0/24 --ipv6=true"),
    ),
    // A UID or GID of 0 or below exempts nothing.
    (
        &["-p", "4143", "-o", "4140", "-u", "0", "-g", "-1"],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-uid=-1",
        ],
        Ok(MINIMAL),
    ),
    // A flag given twice takes its last value, as in pflag.
    (&["-p", "1", "-o", "4140", "-p", "4143"], Ok(MINIMAL)),
    (
        &["-p", "4143", "-o", "4140", "--ipv6=false", "--ipv6"],
        Ok(MINIMAL),
    ),
    // Booleans as Go's strconv.ParseBool takes them.
    (&["-p", "4143", "-o", "4140", "--ipv6"], Ok(MINIMAL)),
    (
        &["-p", "4143", "-o", "4140", "--ipv6", "false"],
        Ok(NO_IPV6),
    ),
    (&["--ipv6", "-p", "4143", "-o", "4140"], Ok(MINIMAL)),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=true",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=1",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=t",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=T",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=TRUE",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=True",
        ],
        Ok(MINIMAL),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=false",
        ],
        Ok(NO_IPV6),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=0",
        ],
        Ok(NO_IPV6),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=f",
        ],
        Ok(NO_IPV6),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=F",
        ],
        Ok(NO_IPV6),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=FALSE",
        ],
        Ok(NO_IPV6),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=False",
        ],
        Ok(NO_IPV6),
    ),
    // Not booleans to Go.
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=yes",
        ],
        Err("'yes'"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=no",
        ],
        Err("'no'"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=on",
        ],
        Err("'on'"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=fAlse",
        ],
        Err("'fAlse'"),
    ),
    (&["-p", "4143", "-o", "4140", "--ipv6", "yes"], Err("'yes'")),
    // Values that are not valid, named.
    (
        &["--incoming-proxy-port=0", "--outgoing-proxy-port=4140"],
        Err("port 0 is out of range"),
    ),
    (
        &["--incoming-proxy-port=4143", "--outgoing-proxy-port=70000"],
        Err("port 70000 is out of range"),
    ),
    (
        &["--incoming-proxy-port=http", "--outgoing-proxy-port=4140"],
        Err("\"http\" is not a port number"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--outbound-ports-to-ignore=443,99999",
        ],
        Err("port 99999"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--inbound-ports-to-ignore=30-20",
        ],
        Err("\"30-20\" has its low end above its high end"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-uid=proxy",
        ],
        Err("\"proxy\" is not a numeric id"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-gid=4294967296",
        ],
        Err("\"4294967296\" is not a numeric id"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--subnets-to-ignore=10.0.0.0/40",
        ],
        Err("\"10.0.0.0/40\" is not a CIDR"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--outbound-subnets-to-ignore=::/129",
        ],
        Err("\"::/129\" is not a CIDR"),
    ),
    (
        &[
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ports-to-redirect=80-90",
        ],
        Err("\"80-90\" is not a port number"),
    ),
    (
        &["-p", "4143", "-o", "4140", "-r", "80-90"],
        Err("\"80-90\" is not a port number"),
    ),
    (
        &["-p", "0", "-o", "4140"],
        Err("invalid value '0' for '--incoming-proxy-port"),
    ),
    // Flags missing, without a value, unknown; stray arguments.
    (&["-o", "4140"], Err("--incoming-proxy-port")),
    (&["-p", "4143"], Err("--outgoing-proxy-port")),
    (&["-p", "4143", "-o"], Err("--outgoing-proxy-port")),
    (
        &["-p", "4143", "-o", "4140", "--banana", "1"],
        Err("'--banana'"),
    ),
    (&["-p", "4143", "-o", "4140", "-x"], Err("'-x'")),
    (&["-p", "4143", "-o", "4140", "4190"], Err("'4190'")),
];
