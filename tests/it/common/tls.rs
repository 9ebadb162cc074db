//! Certificates made at test run time (rcgen): a throwaway CA and leaf certificates it signs,
//! written as PEM files into a temporary directory. No private key is committed anywhere.
//!
//! Also the TLS clients the tests use: reqwest (HTTP/1.1 or HTTP/2 over TLS by ALPN, or h2c by
//! prior knowledge) trusting only the test CA, and a raw rustls handshake to read which
//! certificate a listener serves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tempfile::TempDir;

/// A CA and the files of the certificates it issued.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
    dir: TempDir,
}

/// PEM files of one issued certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    /// Certificate chain (leaf only: the CA is the trust anchor).
    pub cert: PathBuf,
    /// Private key (PKCS#8).
    pub key: PathBuf,
    /// The leaf in DER, to compare with what a server presents.
    pub der: Vec<u8>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign CA");
        let dir = tempfile::Builder::new()
            .prefix("slidegate-pki-")
            .tempdir()
            .expect("pki tempdir");
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).expect("write ca.pem");
        TestCa { cert, key, dir }
    }

    /// The CA certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The CA certificate in PEM.
    pub fn ca_pem(&self) -> String {
        self.cert.pem()
    }

    /// Issue a certificate for `names` (DNS names or IP addresses) as `<file>.pem` and
    /// `<file>.key` in this CA's directory.
    pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, file);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign leaf");
        let issued = Issued {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write cert");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// How a reqwest client talks to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 in the clear.
    H1,
    /// HTTP/2 with prior knowledge in the clear (h2c).
    H2c,
    /// HTTP/1.1 over TLS (ALPN http/1.1).
    H1Tls,
    /// HTTP/2 over TLS (ALPN h2).
    H2Tls,
}

impl Protocol {
    /// Every protocol.
    pub const ALL: [Protocol; 4] = [
        Protocol::H1,
        Protocol::H2c,
        Protocol::H1Tls,
        Protocol::H2Tls,
    ];

    /// Does it use the TLS listener?
    pub fn tls(self) -> bool {
        matches!(self, Protocol::H1Tls | Protocol::H2Tls)
    }

    /// The HTTP version the response must come back in.
    pub fn version(self) -> reqwest::Version {
        match self {
            Protocol::H1 | Protocol::H1Tls => reqwest::Version::HTTP_11,
            Protocol::H2c | Protocol::H2Tls => reqwest::Version::HTTP_2,
        }
    }

    /// A client speaking this protocol, trusting only `ca_pem` for TLS.
    pub fn client(self, ca_pem: &str) -> reqwest::Client {
        self.client_resolving(ca_pem, &[])
    }

    /// [`Protocol::client`] that resolves each of `hosts` (host name, address) without DNS and
    /// keeps the server's certificate of each response (`reqwest::tls::TlsInfo`).
    pub fn client_resolving(self, ca_pem: &str, hosts: &[(&str, SocketAddr)]) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA pem");
        let mut builder = reqwest::Client::builder().tls_info(true);
        for (host, addr) in hosts {
            builder = builder.resolve(host, *addr);
        }
        let builder = builder
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .use_rustls_tls()
            .timeout(Duration::from_secs(30))
            .no_proxy();
        let builder = match self {
            Protocol::H1 | Protocol::H1Tls => builder.http1_only(),
            Protocol::H2c => builder.http2_prior_knowledge(),
            // ALPN offers h2 and http/1.1; the proxy must pick h2.
            Protocol::H2Tls => builder,
        };
        builder.build().expect("reqwest client")
    }
}

/// Handshake with `addr` (SNI `localhost`), trusting nothing, and return the leaf certificate
/// the server presented (DER).
pub async fn presented_leaf(addr: SocketAddr) -> Vec<u8> {
    handshake(addr, Some("localhost"), TLS_ANY)
        .await
        .expect("TLS handshake")
        .leaf
}

/// TLS 1.2 and 1.3, for [`handshake`].
pub const TLS_ANY: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS12, &rustls::version::TLS13];
/// TLS 1.2 only, for [`handshake`]: a client the proxy refuses with `tls_min_version = "1.3"`.
pub const TLS_12_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

/// What a handshake agreed on.
#[derive(Debug)]
pub struct Handshake {
    /// The leaf certificate the server presented (DER).
    pub leaf: Vec<u8>,
    /// The protocol version.
    pub version: rustls::ProtocolVersion,
}

/// Handshake with `addr` offering `versions`, sending `sni` (`None`: no SNI extension, as a
/// client connecting by IP address), trusting any certificate: what the server presents, or
/// why the handshake failed.
pub async fn handshake(
    addr: SocketAddr,
    sni: Option<&str>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Handshake, String> {
    #[derive(Debug)]
    struct Anything(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for Anything {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Anything(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect TLS listener");
    // rustls sends no SNI for an IP address.
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).expect("a DNS name"),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .expect("TLS handshake timed out")
        .map_err(|e| e.to_string())?;
    let conn = tls.get_ref().1;
    Ok(Handshake {
        leaf: conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .expect("server presented no certificate"),
        version: conn.protocol_version().expect("version after handshake"),
    })
}

/// The DNS names of a certificate's subjectAltName (DER), as a client reads them.
pub fn san_dns_names(der: &[u8]) -> Vec<String> {
    let der = CertificateDer::from(der);
    let cert = webpki::EndEntityCert::try_from(&der).expect("a parsable certificate");
    cert.valid_dns_names().map(str::to_owned).collect()
}

/// A rustls server config for a test upstream serving `issued`, offering h2 and http/1.1.
pub fn server_config(issued: &Issued) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&issued.cert)
        .expect("open cert")
        .map(|c| c.expect("cert pem"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(&issued.key).expect("key pem");
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server cert");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// Proxy options serving a leaf of `ca` (for `localhost` and `127.0.0.1`) on the TLS listener,
/// with more `[server]` lines.
pub fn tls_options(ca: &TestCa, server_lines: &str) -> super::proxy::ProxyOptions {
    let leaf = ca.issue("proxy", &["localhost", "127.0.0.1"]);
    super::proxy::ProxyOptions {
        tls: Some((leaf.cert, leaf.key)),
        server_extra: server_lines.to_string(),
        ..super::proxy::ProxyOptions::default()
    }
}

/// `n` proxies on `config`, each with a TLS listener (a leaf of `ca`) and h2c beside plain
/// HTTP/1.1, its store answering (`/readyz?store` 200): what a test of every protocol on shared
/// state starts.
pub fn ready_on_every_protocol(config: &str, ca: &TestCa, n: usize) -> Vec<super::proxy::Proxy> {
    (0..n)
        .map(|_| {
            let proxy = super::proxy::Proxy::start_with(config, tls_options(ca, "h2c = true"));
            super::admin::wait_readyz(&proxy, 200, Duration::from_secs(20));
            proxy
        })
        .collect()
}

/// A TLS 1.2-style ClientHello record whose SNI extension carries `name` as sent (rustls
/// refuses an invalid host name, so a client library cannot send one): for tests of what a
/// server does with an illegal SNI.
pub fn client_hello_with_sni(name: &[u8]) -> Vec<u8> {
    let be16 = |n: usize| (n as u16).to_be_bytes();
    let mut sni = vec![0u8]; // host_name
    sni.extend_from_slice(&be16(name.len()));
    sni.extend_from_slice(name);
    let mut ext = vec![0, 0]; // server_name
    ext.extend_from_slice(&be16(sni.len() + 2));
    ext.extend_from_slice(&be16(sni.len()));
    ext.extend_from_slice(&sni);
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    hello.extend_from_slice(&[1, 0]); // null compression
    hello.extend_from_slice(&be16(ext.len()));
    hello.extend_from_slice(&ext);
    let mut handshake = vec![1u8, 0]; // client_hello, 24-bit length
    handshake.extend_from_slice(&be16(hello.len()));
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&be16(handshake.len()));
    record.extend_from_slice(&handshake);
    record
}
