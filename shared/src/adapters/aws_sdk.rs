//! The AWS SDK's configuration, read once from the environment for every AWS client of a
//! process: the store's, the queue's, the scheduler's and Bedrock's.

use aws_config::{BehaviorVersion, SdkConfig};

use super::env_template::setting;
use super::trust;

/// The SDK configuration from the environment: region, credentials and `AWS_ENDPOINT_URL`.
/// Its HTTPS client trusts the system bundle's roots, read once (see `adapters::trust`).
pub async fn sdk_config() -> SdkConfig {
    let loader = from_lambda_env(aws_config::defaults(BehaviorVersion::latest()));
    match trust::bundle_pem() {
        Some(pem) => loader.http_client(sdk_https_client(pem)),
        None => loader,
    }
    .load()
    .await
}

/// Where the environment names the region and holds the credentials, as Lambda's does, the
/// loader takes them from there, as the default chains would (the environment comes first in
/// each), without building the chains' other providers (profile, SSO, web identity, ECS,
/// IMDS): most of the configuration's CPU at start-up.
fn from_lambda_env(loader: aws_config::ConfigLoader) -> aws_config::ConfigLoader {
    let region = setting("AWS_REGION").or_else(|| setting("AWS_DEFAULT_REGION"));
    let credentials =
        setting("AWS_ACCESS_KEY_ID").is_some() && setting("AWS_SECRET_ACCESS_KEY").is_some();
    let loader = match region {
        Some(region) => loader.region(aws_config::Region::new(region)),
        None => loader,
    };
    if credentials {
        loader.credentials_provider(
            aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
        )
    } else {
        loader
    }
}

/// The SDK's default HTTPS client (hyper with rustls on aws-lc, its proxy settings from the
/// environment), with the given roots instead of the platform loader's.
fn sdk_https_client(pem: Vec<u8>) -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig};

    let roots = TrustStore::empty().with_pem_certificate(pem);
    let context = TlsContext::builder()
        .with_trust_store(roots)
        .build()
        .expect("a TLS context of PEM roots");
    Builder::new().build_with_connector_fn(move |settings, components| {
        // Each client built on the configuration probes its HTTP client once (no settings, no
        // runtime components) and drops what it gets: a plain connector will do, so the roots
        // are decoded once, for the connector the clients' requests share.
        let Some(components) = components else {
            return ConnectorBuilder::default().build_http();
        };
        let mut connector = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .tls_context(context.clone());
        connector.set_connector_settings(settings.cloned());
        connector.set_sleep_impl(components.sleep_impl());
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}
