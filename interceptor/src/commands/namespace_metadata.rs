//! `interceptor namespace-metadata`: the chart's post-install and post-upgrade hook Job labels
//! the release's namespace, as Linkerd's extensions' `namespace-metadata` Job does with
//! linkerd-extension-init: Helm does not own a namespace it did not create
//! (`--create-namespace`), so its metadata cannot come from a template.
//!
//! One merge patch sets [`NAMESPACE_LABELS`] and [`NAMESPACE_ANNOTATIONS`], and sets or removes
//! the [`EXTENSION_LABEL`] (`--linkerd-extension`), leaving the rest of the namespace's metadata
//! as it is; it needs only `patch` on that namespace. While the API does
//! not answer, or refuses (a new role may take a moment to apply), it is tried again, for at most
//! `--timeout-ms`.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use crate::{
    cli::NamespaceMetadataArgs,
    health::{
        EXTENSION, EXTENSION_LABEL, NAMESPACE_ANNOTATIONS, NAMESPACE_LABELS,
        cluster::REQUEST_TIMEOUT,
    },
    kubernetes,
};

/// The merge patch (RFC 7386) of the namespace's metadata; without `linkerd_extension`, its
/// null removes the extension label (an upgrade that turns the chart's `linkerdExtension` off).
pub fn patch(linkerd_extension: bool) -> Value {
    let map = |entries: &[(&str, &str, &str)]| -> Map<String, Value> {
        entries
            .iter()
            .map(|(key, value, _)| ((*key).to_owned(), Value::from(*value)))
            .collect()
    };
    let mut labels = map(NAMESPACE_LABELS);
    labels.insert(
        EXTENSION_LABEL.to_owned(),
        if linkerd_extension {
            Value::from(EXTENSION)
        } else {
            Value::Null
        },
    );
    json!({
        "metadata": {
            "labels": labels,
            "annotations": map(NAMESPACE_ANNOTATIONS),
        }
    })
}

/// Whether the API's answer will not change by asking again.
fn permanent(status: &kube::core::Status) -> bool {
    matches!(status.code, 400 | 404 | 405 | 415 | 422)
}

pub fn namespace_metadata(args: NamespaceMetadataArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let namespace = &args.namespace;
        let client = kubernetes::client(args.kubeconfig.as_deref())
            .await
            .map_err(anyhow::Error::msg)?;
        let namespaces: Api<Namespace> = Api::all(client);
        let body = patch(args.linkerd_extension);
        let patch = Patch::Merge(&body);
        let params = PatchParams {
            field_manager: Some("interceptor-namespace-metadata".to_owned()),
            ..PatchParams::default()
        };
        let timeout = Duration::from_millis(args.timeout_ms);
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_secs(1);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let request = namespaces.patch(namespace, &params, &patch);
            let error = match tokio::time::timeout(REQUEST_TIMEOUT.min(left), request).await {
                Ok(Ok(_)) => {
                    info!(%namespace, metadata = %body["metadata"], "namespace labelled for Linkerd");
                    return Ok(());
                }
                Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                    anyhow::bail!("namespace {namespace} not found: {}", status.message)
                }
                Ok(Err(kube::Error::Api(status))) if permanent(&status) => anyhow::bail!(
                    "the Kubernetes API refused the patch of namespace {namespace}: {} {}: {}",
                    status.code,
                    status.reason,
                    status.message
                ),
                Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => format!(
                    "{} {}: {} (this account needs patch on namespaces, for {namespace})",
                    status.code, status.reason, status.message
                ),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!(
                    "the Kubernetes API did not answer within {} s",
                    REQUEST_TIMEOUT.min(left).as_secs_f32()
                ),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                anyhow::bail!(
                    "labelling namespace {namespace}: no success within {} ms: {error}",
                    args.timeout_ms
                );
            }
            warn!(%namespace, %error, "patching the namespace; trying again");
            tokio::time::sleep(delay.min(left)).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_labels_and_annotates_as_linkerd_extensions_are() {
        let extension = patch(true);
        assert_eq!(
            extension,
            json!({
                "metadata": {
                    "labels": {
                        "linkerd.io/extension": "interceptor",
                        "linkerd.io/cni-resource": "true",
                        "config.linkerd.io/admission-webhooks": "disabled",
                        "pod-security.kubernetes.io/enforce": "privileged",
                    },
                    "annotations": { "linkerd.io/inject": "disabled" },
                }
            })
        );
        // Unasked, the label is removed (a merge patch's null), the rest the same.
        let mut plain = extension;
        plain["metadata"]["labels"]["linkerd.io/extension"] = Value::Null;
        assert_eq!(patch(false), plain);
    }
}
