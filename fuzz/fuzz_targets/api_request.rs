//! The agent's request decoding: one JSON `Request` as its socket reads it, a registration's
//! configuration (`config`, or an older client's proxy-init flags in `args`) read with it. What the agent does next (its pod table, the backends) lives in the `interceptor` crate
//! with the eBPF build and is not driven here. The plugin's side, the agent's `Response`, is
//! decoded from the same bytes.
#![no_main]

use interceptor_api::{PodAddRequest, Request, Response};
use interceptor_fuzz::assert_round_trips;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<Request>(data) {
        let value = serde_json::to_value(&request).expect("a request serializes");
        let back: Request =
            serde_json::from_value(value.clone()).expect("a decoded request decodes again");
        assert_eq!(
            serde_json::to_value(&back).expect("a request serializes"),
            value
        );
        if let Request::Add(add) = &request {
            assert_round_trips(&add.config, "a registration's configuration");
        }
    }
    // A registration refused for its configuration says why, in either form.
    if let Ok(add) = serde_json::from_slice::<PodAddRequest>(data)
        && let Err(e) = add.config()
    {
        assert!(!e.to_string().is_empty(), "a refusal says why");
    }
    if let Ok(response) = serde_json::from_slice::<Response>(data) {
        let value = serde_json::to_value(&response).expect("a response serializes");
        serde_json::from_value::<Response>(value).expect("a decoded response decodes again");
    }
});
