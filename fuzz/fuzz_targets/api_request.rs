//! The agent's request decoding: one JSON `Request` as its socket reads it, then a
//! registration's configuration (`config`, or proxy-init's flags in `args`) as the agent takes
//! it. What the agent does next (its pod table, the backends) lives in the `interceptor` crate
//! with the eBPF build and is not driven here. The plugin's side, the agent's `Response`, is
//! decoded from the same bytes.
#![no_main]

use interceptor_api::{Request, Response};
use interceptor_config::InterceptionConfig;
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
            match add.config() {
                Ok(config) => {
                    let json = serde_json::to_string(&config).expect("a configuration serializes");
                    let back: InterceptionConfig = serde_json::from_str(&json)
                        .unwrap_or_else(|e| panic!("{json} of an accepted configuration: {e}"));
                    assert_eq!(back, config);
                }
                Err(e) => assert!(!e.to_string().is_empty(), "a refusal says why"),
            }
        }
    }
    if let Ok(response) = serde_json::from_slice::<Response>(data) {
        let value = serde_json::to_value(&response).expect("a response serializes");
        serde_json::from_value::<Response>(value).expect("a decoded response decodes again");
    }
});
