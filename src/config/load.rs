//! Loading: the file (or the embedded default), the environment's and the
//! flags' overrides applied to it, and its resolution into what the engine
//! runs with ([`Resolved`]): every check, the TLS files read.

use super::{overrides, Cli, Config, Resolved, Source};
use crate::cluster::sites::Sites;
use serde::Deserialize;

impl Source {
    /// The file's text (`""`: the embedded default).
    pub(super) fn text(&self) -> Result<String, String> {
        match &self.config_path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {path:?}: {e}")),
            None => Ok(String::new()),
        }
    }

    /// Where errors in the file are: its path.
    pub(super) fn name(&self) -> &str {
        self.config_path.as_deref().unwrap_or("(embedded default)")
    }
}

impl Config {
    /// Parse TOML text.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| format!("invalid config: {e}"))
    }

    /// Load from the CLI's file (or the embedded default), apply the
    /// environment's and the flags' overrides, and validate. An error
    /// names the key and the value, and the variable or flag that set it.
    pub fn load(cli: &Cli, available_cores: usize) -> Result<Resolved, String> {
        let mut source = Source {
            config_path: cli.config_path.clone(),
            available_cores,
            ..Source::default()
        };
        let text = source.text()?;
        let name = source.name().to_string();
        // The file alone first: its errors point at its lines.
        let mut config = Config::from_toml(&text).map_err(|e| format!("{name}: {e}"))?;
        let mut warnings = cli.warnings.clone();
        if !cli.overrides.is_empty() {
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
            let (applied, unknown) = overrides::apply(&mut table, &cli.overrides)?;
            config = Config::deserialize(toml::Value::Table(table.clone()))
                .map_err(|e| format!("invalid config: {}", e.to_string().trim_end()))?;
            (source.applied, source.table) = (applied, table);
            warnings.extend(unknown);
        } else {
            source.table = toml::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
        }
        let mut resolved = config
            .resolve(available_cores)
            .map_err(|e| overrides::annotate(e, &source.applied))?;
        warnings.append(&mut resolved.warnings);
        (resolved.source, resolved.warnings) = (source, warnings);
        Ok(resolved)
    }

    /// Check every value and derive what the engine needs, reading the
    /// TLS files (a bad path or PEM is an error naming the key and file).
    pub fn resolve(self, available_cores: usize) -> Result<Resolved, String> {
        let (peer_tls, client_roots) = self.load_cluster_tls()?;
        let tls = self.load_tls(client_roots)?;
        let (callback_tls, warning) = self.load_callback_tls()?;
        let mut resolved = self.resolve_with(available_cores, None)?;
        resolved.tls = tls;
        resolved.callback_tls = Some(callback_tls);
        resolved.peer_tls = peer_tls;
        resolved.warnings.extend(warning);
        Ok(resolved)
    }

    /// `resolve`, with `sites` already resolved (a reload keeps the ones
    /// the node started with, host names and all).
    pub(super) fn resolve_with(
        self,
        available_cores: usize,
        sites: Option<Sites>,
    ) -> Result<Resolved, String> {
        let (ip, shards) = self.check_engine(available_cores)?;
        self.check_limits()?;
        let guard = self.resolve_guard()?;
        let signing_keys = self.resolve_signing_keys()?;
        let cluster = self.cluster.resolve(ip, self.http.bind_port)?;
        let instance_id = self.resolve_instance(&cluster)?;
        self.check_skew_rule(&cluster)?;
        let sites = match sites {
            Some(sites) => sites,
            None => self.sites.resolve(self.http.bind_port)?,
        };
        assert!(
            shards >= 1 && shards <= available_cores,
            "the checks keep shards within the cores"
        );
        Ok(Resolved {
            config: self,
            shards,
            cluster,
            instance_id,
            sites,
            source: Source::default(),
            warnings: Vec::new(),
            tls: None,
            callback_tls: None,
            peer_tls: None,
            guard,
            signing_keys,
        })
    }
}
