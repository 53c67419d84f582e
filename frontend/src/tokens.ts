/**
 * Agent tokens as the panel lists them and the "Connect an agent" dialog makes them (pure: unit-tested
 * without a page): the form's choices from the server's contract, the request it sends, the list the
 * server answers, and what an agent needs to connect (the command line, an MCP client's JSON, curl).
 * The server checks everything and says what is wrong (docs/api.md, agent tokens).
 */
import { IAgentToken, ITokenRequest } from './api';
import { TranslationBundle } from '@jupyterlab/translation';

/** What a new token may have, as the server's contract (its `AgentTokenRequest` schema) says. */
export interface ITokenChoices {
  scopes: string[];
  /** The actions a token may ask the person for first. */
  ask: string[];
  /** The longest lifetime the server allows, in seconds (its admin's cap); null or absent: no cap. */
  maxLifetime?: number | null;
}

/** The choices when the contract cannot be read: those of the server this frontend ships with. */
export const DEFAULT_CHOICES: ITokenChoices = {
  scopes: ['read', 'edit', 'execute'],
  ask: ['edit', 'execute', 'kernel']
};

/** The choices the contract (`GET /api/agent/openapi.json`) gives, each part the default without it. */
export function tokenChoices(contract: unknown): ITokenChoices {
  const properties = (contract as any)?.components?.schemas?.AgentTokenRequest
    ?.properties;
  const values = (schema: any, fallback: string[]): string[] => {
    const found = schema?.items?.enum;
    return Array.isArray(found) &&
      found.length &&
      found.every(v => typeof v === 'string')
      ? [...found]
      : fallback;
  };
  return {
    scopes: values(properties?.scopes, DEFAULT_CHOICES.scopes),
    ask: values(properties?.ask, DEFAULT_CHOICES.ask)
  };
}

/** What a scope allows, in a line (a scope this frontend does not know: its name alone). */
export function scopeHint(trans: TranslationBundle, scope: string): string {
  switch (scope) {
    case 'read':
      return trans.__('read notebooks and files, list sessions and kernels');
    case 'edit':
      return trans.__('read, plus notebook edits and file writes');
    case 'execute':
      return trans.__('run code: eval, notebook runs, kernels, terminals');
  }
  return '';
}

/** What asking before an action means, in a line. */
export function askHint(trans: TranslationBundle, action: string): string {
  switch (action) {
    case 'edit':
      return trans.__('before it edits a notebook or undoes a change');
    case 'execute':
      return trans.__('before it runs code');
    case 'kernel':
      return trans.__(
        "before it interrupts, restarts or shuts down a notebook's kernel"
      );
  }
  return '';
}

/** A lifetime the form offers: its seconds (null: until revoked) and its label. */
export interface IExpiry {
  seconds: number | null;
  label: string;
}

/** The lifetimes the form offers, shortest first: with a cap (`maxLifetime`), those within it and the
 * cap itself. */
export function expiries(
  trans: TranslationBundle,
  maxLifetime: number | null = null
): IExpiry[] {
  const day = 86400;
  const all: IExpiry[] = [
    { seconds: 3600, label: trans.__('1 hour') },
    { seconds: 8 * 3600, label: trans.__('8 hours') },
    { seconds: day, label: trans.__('1 day') },
    { seconds: 7 * day, label: trans.__('7 days') },
    { seconds: 30 * day, label: trans.__('30 days') },
    { seconds: null, label: trans.__('Never (until revoked)') }
  ];
  if (maxLifetime === null) {
    return all;
  }
  const within = all.filter(
    expiry => expiry.seconds !== null && expiry.seconds <= maxLifetime
  );
  if (!within.some(expiry => expiry.seconds === maxLifetime)) {
    within.push({
      seconds: maxLifetime,
      label: trans.__(
        '%1 (the longest this server allows)',
        lasting(trans, maxLifetime)
      )
    });
  }
  return within;
}

/** A number of seconds as the form names a lifetime: days, hours or minutes. */
function lasting(trans: TranslationBundle, seconds: number): string {
  if (seconds % 86400 === 0) {
    return trans._n('%1 day', '%1 days', seconds / 86400);
  }
  if (seconds % 3600 === 0) {
    return trans._n('%1 hour', '%1 hours', seconds / 3600);
  }
  return trans._n('%1 minute', '%1 minutes', Math.round(seconds / 60));
}

/** The server's cap on a token's lifetime in `GET /api/agent/tokens`'s answer, or null (none). */
export function tokenLimit(answer: unknown): number | null {
  const limit = (answer as any)?.max_lifetime;
  return typeof limit === 'number' && limit > 0 ? limit : null;
}

/** The lifetime the form starts with. */
export const DEFAULT_EXPIRY = 7 * 86400;

/** What the form holds, as typed and ticked. */
export interface ITokenForm {
  name: string;
  scopes: string[];
  /** Globs, one a line. */
  paths: string;
  ask: string[];
  expiresIn: number | null;
}

/** The form a new token starts from (its lifetime within the server's cap, when it has one). */
export function emptyForm(maxLifetime: number | null = null): ITokenForm {
  return {
    name: '',
    scopes: ['read'],
    paths: '',
    ask: [],
    expiresIn:
      maxLifetime === null
        ? DEFAULT_EXPIRY
        : Math.min(DEFAULT_EXPIRY, maxLifetime)
  };
}

/** The request of a filled form: the name trimmed, one glob a line (blank lines dropped), absent parts
 * left out (the server decides what is valid). */
export function tokenRequest(form: ITokenForm): ITokenRequest {
  const request: ITokenRequest = {
    name: form.name.trim(),
    scopes: [...form.scopes]
  };
  const paths = form.paths
    .split('\n')
    .map(line => line.trim())
    .filter(line => line);
  if (paths.length) {
    request.paths = paths;
  }
  if (form.ask.length) {
    request.ask = [...form.ask];
  }
  if (form.expiresIn !== null) {
    request.expires_in = form.expiresIn;
  }
  return request;
}

const STATUSES = ['active', 'expired', 'revoked'];

/** The tokens of `GET /api/agent/tokens`'s answer (a record without a name or status is left out). */
export function parseTokens(answer: unknown): IAgentToken[] {
  const listed = (answer as any)?.tokens;
  if (!Array.isArray(listed)) {
    return [];
  }
  const strings = (value: unknown): string[] =>
    Array.isArray(value) ? value.filter(v => typeof v === 'string') : [];
  const time = (value: unknown): string | null =>
    typeof value === 'string' ? value : null;
  return listed
    .filter(
      t =>
        t &&
        typeof t.name === 'string' &&
        typeof t.status === 'string' &&
        STATUSES.includes(t.status)
    )
    .map(t => ({
      name: t.name,
      scopes: strings(t.scopes),
      paths: strings(t.paths),
      status: t.status,
      created: typeof t.created === 'string' ? t.created : '',
      expires: time(t.expires),
      last_used: time(t.last_used),
      revoked: time(t.revoked),
      ask: strings(t.ask)
    }));
}

/** The key of a token's row: a name is used again once its token is revoked. */
export function tokenKey(token: IAgentToken): string {
  return `${token.name} ${token.created}`;
}

/** The server's URL as an agent gives it: the page's base URL without its trailing slash. */
export function agentUrl(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, '');
}

/** `value` as one word of a POSIX shell (single quotes). */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, "'\\''")}'`;
}

/** The variables `jupyter agent` (and the MCP examples of docs/mcp.md) read. */
export function cliSnippet(url: string, token: string): string {
  return [
    `export JUPYTER_AGENT_URL=${shellQuote(url)}`,
    `export JUPYTER_AGENT_TOKEN=${shellQuote(token)}`
  ].join('\n');
}

/** An MCP client's configuration (the `mcpServers` shape of Claude Code's `.mcp.json`, docs/mcp.md). */
export function mcpSnippet(url: string, token: string): string {
  return JSON.stringify(
    {
      mcpServers: {
        jupyter: {
          type: 'http',
          url: `${url}/api/agent/mcp`,
          headers: { Authorization: `token ${token}` }
        }
      }
    },
    null,
    2
  );
}

/** Claude Code's command that adds the server (docs/mcp.md "Connect a client"). */
export function claudeCodeSnippet(url: string, token: string): string {
  return [
    `claude mcp add --transport http jupyter ${shellQuote(`${url}/api/agent/mcp`)} \\`,
    `  --header ${shellQuote(`Authorization: token ${token}`)}`
  ].join('\n');
}

/** VS Code's `.vscode/mcp.json` (its `servers` shape). */
export function vscodeSnippet(url: string, token: string): string {
  return JSON.stringify(
    {
      servers: {
        jupyter: {
          type: 'http',
          url: `${url}/api/agent/mcp`,
          headers: { Authorization: `token ${token}` }
        }
      }
    },
    null,
    2
  );
}

/** Codex: the token in the variable its `~/.codex/config.toml` names (Codex refuses a token in the file). */
export function codexSnippet(url: string, token: string): string {
  return [
    `export JUPYTER_AGENT_TOKEN=${shellQuote(token)}`,
    '',
    '# ~/.codex/config.toml',
    '[mcp_servers.jupyter]',
    `url = ${JSON.stringify(`${url}/api/agent/mcp`)}`,
    'bearer_token_env_var = "JUPYTER_AGENT_TOKEN"'
  ].join('\n');
}

/** Claude Desktop (stdio only): `jupyter agent mcp` relays to this server (claude_desktop_config.json). */
export function claudeDesktopSnippet(url: string, token: string): string {
  return JSON.stringify(
    {
      mcpServers: {
        jupyter: {
          command: 'jupyter',
          args: ['agent', 'mcp'],
          env: { JUPYTER_AGENT_URL: url, JUPYTER_AGENT_TOKEN: token }
        }
      }
    },
    null,
    2
  );
}

/** A request that shows who the token is (`/api/me`: any agent token may ask it). */
export function curlSnippet(url: string, token: string): string {
  return `curl -H ${shellQuote(`Authorization: token ${token}`)} ${shellQuote(`${url}/api/me`)}`;
}

/** The ways to connect an agent, each with its title, in the order the dialog shows them. */
export function snippets(
  trans: TranslationBundle,
  baseUrl: string,
  token: string
): { kind: string; title: string; text: string }[] {
  const url = agentUrl(baseUrl);
  return [
    {
      kind: 'cli',
      title: trans.__(
        'Command line (jupyter agent), in the shell the agent runs'
      ),
      text: cliSnippet(url, token)
    },
    {
      kind: 'mcp',
      title: trans.__(
        "An MCP client's configuration (Claude Code's .mcp.json, Cursor's mcp.json)"
      ),
      text: mcpSnippet(url, token)
    },
    {
      kind: 'claude-code',
      title: trans.__('Claude Code, from its command line'),
      text: claudeCodeSnippet(url, token)
    },
    {
      kind: 'vscode',
      title: trans.__('VS Code (.vscode/mcp.json)'),
      text: vscodeSnippet(url, token)
    },
    {
      kind: 'codex',
      title: trans.__('Codex (~/.codex/config.toml, the token in a variable)'),
      text: codexSnippet(url, token)
    },
    {
      kind: 'claude-desktop',
      title: trans.__(
        'Claude Desktop (stdio: jupyter agent mcp relays to this server)'
      ),
      text: claudeDesktopSnippet(url, token)
    },
    {
      kind: 'curl',
      title: trans.__('HTTP (curl): who the token is'),
      text: curlSnippet(url, token)
    }
  ];
}
