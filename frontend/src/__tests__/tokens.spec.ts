import { execFileSync } from 'child_process';

import { ICreatedToken } from '../api';
import {
  agentUrl,
  cliSnippet,
  curlSnippet,
  DEFAULT_CHOICES,
  emptyForm,
  expiries,
  mcpSnippet,
  claudeCodeSnippet,
  claudeDesktopSnippet,
  codexSnippet,
  vscodeSnippet,
  parseTokens,
  shellQuote,
  snippets,
  tokenChoices,
  tokenKey,
  tokenLimit,
  tokenRequest
} from '../tokens';
import { createdNode, TokenForm } from '../tokenviews';
import { translation } from '../i18n';

const trans = translation(null);

const TOKEN = 'jat_4Qm0-x_Yz9';
const HUB = 'https://hub.example/user/alice/';

/** What a POSIX shell makes of `script`'s output (the snippets are meant to be pasted into one). */
function sh(script: string): string {
  return execFileSync('sh', ['-c', script], { encoding: 'utf-8' });
}

describe('the server URL an agent is given', () => {
  it("is the page's base URL without its trailing slash", () => {
    expect(agentUrl(HUB)).toBe('https://hub.example/user/alice');
    expect(agentUrl('http://127.0.0.1:8888/')).toBe('http://127.0.0.1:8888');
    expect(agentUrl('http://127.0.0.1:8888')).toBe('http://127.0.0.1:8888');
  });
});

describe('snippets', () => {
  it('the command line exports what jupyter agent reads, as a shell reads it', () => {
    const text = cliSnippet('https://hub.example/user/alice', TOKEN);
    expect(text).toBe(
      "export JUPYTER_AGENT_URL='https://hub.example/user/alice'\n" +
        `export JUPYTER_AGENT_TOKEN='${TOKEN}'`
    );
    const odd = "https://h/user/o'brien $HOME";
    expect(
      sh(
        `${cliSnippet(odd, TOKEN)}\nprintf '%s|%s' "$JUPYTER_AGENT_URL" "$JUPYTER_AGENT_TOKEN"`
      )
    ).toBe(`${odd}|${TOKEN}`);
  });

  it("an MCP client's JSON: mcpServers.jupyter, http, the MCP endpoint, the token's header", () => {
    expect(
      JSON.parse(mcpSnippet('https://hub.example/user/alice', TOKEN))
    ).toEqual({
      mcpServers: {
        jupyter: {
          type: 'http',
          url: 'https://hub.example/user/alice/api/agent/mcp',
          headers: { Authorization: `token ${TOKEN}` }
        }
      }
    });
  });

  it('curl asks /api/me with the header, each argument one word for the shell', () => {
    const text = curlSnippet('https://hub.example/user/alice', TOKEN);
    expect(text).toBe(
      `curl -H 'Authorization: token ${TOKEN}' 'https://hub.example/user/alice/api/me'`
    );
    // (curl replaced by a function printing each argument it gets on a line)
    expect(sh(`curl() { printf '%s\\n' "$@"; }\n${text}`)).toBe(
      `-H\nAuthorization: token ${TOKEN}\nhttps://hub.example/user/alice/api/me\n`
    );
  });

  it("Claude Code's command: the MCP URL and the header, each one word for the shell", () => {
    const text = claudeCodeSnippet('https://hub.example/user/alice', TOKEN);
    // (claude replaced by a function printing each argument it gets on a line)
    expect(sh(`claude() { printf '%s\\n' "$@"; }\n${text}`)).toBe(
      'mcp\nadd\n--transport\nhttp\njupyter\n' +
        'https://hub.example/user/alice/api/agent/mcp\n' +
        `--header\nAuthorization: token ${TOKEN}\n`
    );
  });

  it("VS Code's servers, Claude Desktop's stdio relay", () => {
    expect(JSON.parse(vscodeSnippet('https://h/u', TOKEN))).toEqual({
      servers: {
        jupyter: {
          type: 'http',
          url: 'https://h/u/api/agent/mcp',
          headers: { Authorization: `token ${TOKEN}` }
        }
      }
    });
    expect(JSON.parse(claudeDesktopSnippet('https://h/u', TOKEN))).toEqual({
      mcpServers: {
        jupyter: {
          command: 'jupyter',
          args: ['agent', 'mcp'],
          env: { JUPYTER_AGENT_URL: 'https://h/u', JUPYTER_AGENT_TOKEN: TOKEN }
        }
      }
    });
  });

  it('Codex: the token in the variable its table names, never in the table', () => {
    const text = codexSnippet('https://h/u', TOKEN);
    const [shell, table] = text.split('\n\n');
    expect(sh(`${shell}\nprintf '%s' "$JUPYTER_AGENT_TOKEN"`)).toBe(TOKEN);
    expect(table.split('\n')).toEqual([
      '# ~/.codex/config.toml',
      '[mcp_servers.jupyter]',
      'url = "https://h/u/api/agent/mcp"',
      'bearer_token_env_var = "JUPYTER_AGENT_TOKEN"'
    ]);
    expect(table).not.toContain(TOKEN);
  });

  it('all of them from the base URL, in order', () => {
    const all = snippets(trans, HUB, TOKEN);
    expect(all.map(s => s.kind)).toEqual([
      'cli',
      'mcp',
      'claude-code',
      'vscode',
      'codex',
      'claude-desktop',
      'curl'
    ]);
    for (const s of all) {
      expect(s.text).toContain(TOKEN);
      expect(s.text).toContain('https://hub.example/user/alice');
      expect(s.text).not.toContain('alice//');
      expect(s.title).toBeTruthy();
    }
  });

  it('shellQuote keeps any text as one word', () => {
    for (const value of ["it's", '$(rm -rf /)', 'a b', "''", '']) {
      expect(sh(`printf '%s' ${shellQuote(value)}`)).toBe(value);
    }
  });
});

describe('the token list', () => {
  const listed = {
    name: 'ci-bot',
    scopes: ['read', 'execute'],
    paths: ['reports/**'],
    status: 'active',
    created: '2026-12-04T10:00:00Z',
    expires: '2026-12-04T18:00:00Z',
    last_used: null,
    revoked: null,
    ask: ['execute']
  };

  it("is the server's records, oldest first, as they are", () => {
    const revoked = {
      ...listed,
      status: 'revoked',
      revoked: '2026-12-04T11:00:00Z',
      created: '2026-12-04T09:00:00Z'
    };
    expect(parseTokens({ tokens: [revoked, listed] })).toEqual([
      revoked,
      listed
    ]);
  });

  it('leaves out what is not a token record, and fills missing lists', () => {
    expect(parseTokens(null)).toEqual([]);
    expect(parseTokens({ tokens: 'x' })).toEqual([]);
    const bare = { name: 'x', status: 'expired' };
    expect(
      parseTokens({
        tokens: [bare, { status: 'active' }, { name: 'y', status: 'weird' }, 7]
      })
    ).toEqual([
      {
        name: 'x',
        scopes: [],
        paths: [],
        status: 'expired',
        created: '',
        expires: null,
        last_used: null,
        revoked: null,
        ask: []
      }
    ]);
  });

  it('keys rows by name and creation: a name is used again after a revoke', () => {
    const [a, b] = parseTokens({
      tokens: [
        { ...listed, status: 'revoked' },
        { ...listed, created: '2026-12-05T10:00:00Z' }
      ]
    });
    expect(tokenKey(a)).not.toBe(tokenKey(b));
  });
});

describe('the form', () => {
  it("reads the choices from the server's contract", () => {
    const contract = {
      components: {
        schemas: {
          AgentTokenRequest: {
            properties: {
              scopes: { items: { enum: ['read', 'edit', 'execute', 'admin'] } },
              ask: { items: { enum: ['execute'] } }
            }
          }
        }
      }
    };
    expect(tokenChoices(contract)).toEqual({
      scopes: ['read', 'edit', 'execute', 'admin'],
      ask: ['execute']
    });
    expect(tokenChoices(null)).toEqual(DEFAULT_CHOICES);
    expect(tokenChoices({ components: { schemas: {} } })).toEqual(
      DEFAULT_CHOICES
    );
  });

  it('sends what was typed: one glob a line, absent parts left out', () => {
    expect(
      tokenRequest({
        name: ' reader ',
        scopes: ['read'],
        paths: 'reports/**\n\n  data/*.csv  \n',
        ask: [],
        expiresIn: 3600
      })
    ).toEqual({
      name: 'reader',
      scopes: ['read'],
      paths: ['reports/**', 'data/*.csv'],
      expires_in: 3600
    });
    expect(
      tokenRequest({
        name: 'x',
        scopes: [],
        paths: '',
        ask: ['edit', 'execute'],
        expiresIn: null
      })
    ).toEqual({ name: 'x', scopes: [], ask: ['edit', 'execute'] });
  });

  it('offers lifetimes from an hour to never', () => {
    const offered = expiries(trans).map(e => e.seconds);
    expect(offered[0]).toBe(3600);
    expect(offered).toContain(86400);
    expect(offered).toContain(7 * 86400);
    expect(offered).toContain(30 * 86400);
    expect(offered[offered.length - 1]).toBeNull();
  });

  it("offers only lifetimes within the server's cap, the cap itself included", () => {
    expect(expiries(trans, 86400).map(e => e.seconds)).toEqual([
      3600,
      8 * 3600,
      86400
    ]);
    const odd = expiries(trans, 3 * 86400);
    expect(odd.map(e => e.seconds)).toEqual([3600, 8 * 3600, 86400, 3 * 86400]);
    expect(odd[odd.length - 1].label).toContain('3 days');
    expect(emptyForm(86400).expiresIn).toBe(86400); // not the 7 days it starts with otherwise
    expect(emptyForm(30 * 86400).expiresIn).toBe(7 * 86400);
    expect(tokenLimit({ tokens: [], max_lifetime: 86400 })).toBe(86400);
    expect(tokenLimit({ tokens: [], max_lifetime: null })).toBeNull();
    expect(tokenLimit({ tokens: [] })).toBeNull();
    const capped = new TokenForm(
      trans,
      { ...DEFAULT_CHOICES, maxLifetime: 86400 },
      emptyForm(86400),
      ''
    );
    const select = capped.node.querySelector('select[data-field="expires"]')!;
    expect(
      Array.from(select.querySelectorAll('option')).map(o => o.value)
    ).toEqual(['3600', '28800', '86400']);
    expect(capped.getValue().expiresIn).toBe(86400);
    capped.dispose();
  });

  it("gives back what it was filled with, and shows the server's refusal", () => {
    const filled = {
      name: 'bot',
      scopes: ['edit'],
      paths: 'a/**\nb/*',
      ask: ['kernel'],
      expiresIn: null
    };
    const form = new TokenForm(
      trans,
      DEFAULT_CHOICES,
      filled,
      "'name' is 1 to 64…"
    );
    expect(form.getValue()).toEqual(filled);
    expect(form.node.querySelector('[role="alert"]')?.textContent).toBe(
      "'name' is 1 to 64…"
    );
    const boxes = form.node.querySelectorAll<HTMLInputElement>('[data-scope]');
    expect(Array.from(boxes).map(b => b.value)).toEqual([
      'read',
      'edit',
      'execute'
    ]);
    boxes[0].checked = true;
    form.node.querySelector<HTMLSelectElement>(
      'select[data-field="expires"]'
    )!.value = '3600';
    expect(form.getValue()).toMatchObject({
      scopes: ['read', 'edit'],
      expiresIn: 3600
    });
    const fresh = new TokenForm(trans, DEFAULT_CHOICES, emptyForm(), '');
    expect(fresh.node.querySelector('[role="alert"]')).toBeNull();
    expect(fresh.getValue()).toEqual(emptyForm());
    form.dispose();
    fresh.dispose();
  });
});

describe('the new token', () => {
  const created: ICreatedToken = {
    name: 'reader',
    scopes: ['read'],
    paths: ['reports/**'],
    status: 'active',
    created: '2026-12-04T10:00:00Z',
    expires: null,
    last_used: null,
    revoked: null,
    ask: [],
    token: TOKEN,
    user: 'agent:reader',
    warnings: ['it runs code unasked']
  };

  it('is shown with the warnings and each way to connect', () => {
    const copied: string[] = [];
    const node = createdNode(trans, created, HUB, text => copied.push(text));
    expect(node.querySelector('[role="alert"]')?.textContent).toBe(
      'it runs code unasked'
    );
    const text = (kind: string) =>
      node.querySelector(`[data-snippet="${kind}"] pre`)?.textContent;
    expect(text('token')).toBe(TOKEN);
    expect(text('cli')).toBe(cliSnippet(agentUrl(HUB), TOKEN));
    expect(text('mcp')).toBe(mcpSnippet(agentUrl(HUB), TOKEN));
    expect(text('curl')).toBe(curlSnippet(agentUrl(HUB), TOKEN));
    node
      .querySelectorAll<HTMLElement>('button[data-copy]')
      .forEach(b => b.click());
    expect(copied).toEqual([
      TOKEN,
      ...snippets(trans, HUB, TOKEN).map(({ kind }) => text(kind))
    ]);
    expect(text('codex')).toBe(codexSnippet(agentUrl(HUB), TOKEN));
    expect(node.textContent).toContain('agent:reader');
    expect(node.textContent).toContain('reports/**');
  });
});
