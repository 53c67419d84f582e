/**
 * The panel's lists (requests, sessions, runs, changes, agent tokens), rendered from the model's
 * `stateChanged` by JupyterLab's `VDomRenderer` (React keeps each row by its key: a row's node stays, and
 * what it shows is patched), and the views of a request's details and of a change's diff that the
 * panel and the commands' dialogs show. The DOM classes and data attributes are docs/panel.md's hooks.
 */
import { VDomRenderer } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import type { IAgentModel } from './agentModel';
import {
  IAgentToken,
  IApproval,
  IChange,
  IChangeDetail,
  ISession
} from './api';
import {
  beyondBox,
  notebookOf,
  notShown,
  shown,
  unshownCount,
  visibleParts
} from './approvals';
import {
  cellDiffText,
  changedCells,
  describeChange,
  diffLines,
  elapsed,
  runningCell,
  when
} from './format';
import { tokenKey } from './tokens';

/** What a list shows of the model: its rows, and what shows when it has none. */
export interface IListOptions {
  /** `data-section`. */
  name: string;
  title: string;
  /** The rows (each an `<li>` with its key). */
  rows: (model: IAgentModel) => React.ReactElement[];
  /** What shows instead of an empty list: `text`, as a warning when `warn`. */
  empty: (model: IAgentModel) => { text: string; warn: boolean };
  /** Hidden while it has no rows. */
  hideEmpty?: boolean;
}

/** A titled list of the panel, drawn again each time the model's state changes. */
export class ListSection extends VDomRenderer<IAgentModel> {
  constructor(
    model: IAgentModel,
    private readonly options: IListOptions
  ) {
    super(model);
    this.addClass('jp-AgentActivity-section');
    this.node.dataset.section = options.name;
  }

  protected render(): React.ReactElement {
    const { options, model } = this;
    const rows = options.rows(model);
    this.node.hidden = !!options.hideEmpty && rows.length === 0;
    const empty = rows.length ? null : options.empty(model);
    return (
      <>
        <h3 className="jp-AgentActivity-sectionTitle">{options.title}</h3>
        {empty ? (
          <div
            className={
              'jp-AgentActivity-empty' +
              (empty.warn ? ' jp-AgentActivity-notice' : '')
            }
          >
            {empty.text}
          </div>
        ) : (
          <ul className="jp-AgentActivity-list">{rows}</ul>
        )}
      </>
    );
  }
}

/** Text with each control or invisible character as a marked escape (never as itself). */
function Visible({ text }: { text: string }): React.ReactElement {
  return (
    <>
      {visibleParts(text).map(([piece, escaped], i) =>
        escaped ? (
          <span key={i} className="jp-AgentActivity-control">
            {piece}
          </span>
        ) : (
          <React.Fragment key={i}>{piece}</React.Fragment>
        )
      )}
    </>
  );
}

/** A unified diff, its added and removed lines marked. */
export function DiffText({ diff }: { diff: string }): React.ReactElement {
  return (
    <pre className="jp-AgentActivity-code jp-AgentActivity-diffText">
      {diffLines(diff).map(([text, kind], i) => (
        <span key={i} className={kind ? `jp-mod-${kind}` : undefined}>
          <Visible text={`${text}\n`} />
        </span>
      ))}
    </pre>
  );
}

/** What a request would do, in full: each cell's code or diff (monospace, scrollable). */
export function ApprovalDetails({
  trans,
  approval
}: {
  trans: TranslationBundle;
  approval: IApproval;
}): React.ReactElement {
  const warning = notShown(trans, approval);
  return (
    <div className="jp-AgentActivity-asked">
      {warning && <div className="jp-AgentActivity-notShown">{warning}</div>}
      {shown(trans, approval).map((part, i) => {
        const hidden = unshownCount(part.text);
        const beyond = beyondBox(trans, part.text);
        return (
          <React.Fragment key={i}>
            {part.title && (
              <div className="jp-AgentActivity-partTitle">{part.title}</div>
            )}
            {hidden > 0 && (
              <div className="jp-AgentActivity-notShown">
                {trans._n(
                  '%1 control or invisible character is shown as a marked escape',
                  '%1 control or invisible characters are shown as marked escapes',
                  hidden
                )}
              </div>
            )}
            {part.diff ? (
              <DiffText diff={part.text} />
            ) : (
              <pre className="jp-AgentActivity-code">
                <Visible text={part.text} />
              </pre>
            )}
            {beyond && <div className="jp-AgentActivity-beyond">{beyond}</div>}
          </React.Fragment>
        );
      })}
    </div>
  );
}

/** A change's detail: each cell's unified diff, or its other parts before and after. */
export function ChangeDiff({
  trans,
  detail
}: {
  trans: TranslationBundle;
  detail: IChangeDetail;
}): React.ReactElement {
  return (
    <div className="jp-AgentActivity-diff">
      <div className="jp-AgentActivity-diffHeader">
        {trans.__(
          '%1 via %2, %3',
          detail.user ?? trans.__('unknown'),
          detail.via ?? '?',
          when(trans, detail.time)
        )}
      </div>
      {detail.cells.map((cell, i) => (
        <React.Fragment key={i}>
          <h4>
            {trans.__('cell %1: %2', cell.id ?? '?', cell.what.join(', '))}
          </h4>
          <DiffText diff={cellDiffText(trans, cell)} />
        </React.Fragment>
      ))}
    </div>
  );
}

function Line({ children }: { children: React.ReactNode }) {
  return <div className="jp-AgentActivity-line">{children}</div>;
}

function Field({ children }: { children: React.ReactNode }) {
  return <span className="jp-AgentActivity-field">{children}</span>;
}

/** A row's buttons: `[action, label]`, or `[action, label, classes]` instead of minimal ones; the panel
 * runs the command of a button's `data-action`. */
function Buttons({
  actions,
  disabled = () => false
}: {
  actions: ([string, string] | [string, string, string])[];
  disabled?: (action: string) => boolean;
}) {
  return (
    <div className="jp-AgentActivity-actions">
      {actions.map(([action, label, classes]) => (
        <button
          key={action}
          className={`jp-Button jp-mod-small ${classes ?? 'jp-mod-minimal'}`}
          data-action={action}
          disabled={disabled(action) || undefined}
        >
          {label}
        </button>
      ))}
    </div>
  );
}

/** An ISO time as the clock shows it (`14:03`). */
function clock(iso: string): string {
  return new Date(iso).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
}

/** A request waiting for the person: what it would do, a reason to give, Approve and Deny. `reveal` is
 * told its node once drawn. */
export function approvalRow(
  trans: TranslationBundle,
  a: IApproval,
  reveal: (node: HTMLElement | null) => void
): React.ReactElement {
  return (
    <li
      key={a.id}
      ref={reveal}
      className="jp-AgentActivity-row jp-AgentActivity-approval"
      data-approval-id={a.id}
    >
      <Line>
        <strong className="jp-AgentActivity-name">{a.agent}</strong>
        <span className={`jp-AgentActivity-state jp-mod-${a.action}`}>
          {a.action}
        </span>
        <Field>{`#${a.id}`}</Field>
      </Line>
      <Line>
        <span className="jp-AgentActivity-summary">
          <Visible text={a.summary} />
        </span>
      </Line>
      <Line>
        <Field>{notebookOf(a) ?? trans.__('no notebook')}</Field>
        <Field>{trans.__('via %1', a.door)}</Field>
      </Line>
      <Line>
        <Field>
          {trans.__('asked %1, expires %2', clock(a.created), clock(a.expires))}
        </Field>
      </Line>
      <ApprovalDetails trans={trans} approval={a} />
      <input
        className="jp-AgentActivity-reason"
        type="text"
        data-field="reason"
        placeholder={trans.__('Reason (optional, the agent is told)')}
        aria-label={trans.__('Reason for denying')}
        maxLength={1000}
      />
      <Buttons
        actions={[
          ['approve', trans.__('Approve'), 'jp-mod-styled jp-mod-accept'],
          ['approve-for', trans.__('Approve for 10 minutes'), 'jp-mod-styled'],
          ['deny', trans.__('Deny'), 'jp-mod-styled jp-mod-warn']
        ]}
        // not approvable on a preview: the full request is being read
        disabled={action => !!a.preview && action.startsWith('approve')}
      />
    </li>
  );
}

export function sessionRow(
  trans: TranslationBundle,
  s: ISession
): React.ReactElement {
  const state = s.busy ? 'busy' : s.state;
  return (
    <li key={s.name} className="jp-AgentActivity-row" data-session={s.name}>
      <Line>
        <strong className="jp-AgentActivity-name">
          {s.notebook ?? s.name}
        </strong>
        <span className={`jp-AgentActivity-state jp-mod-${state}`}>
          {
            s.busy
              ? trans.__('busy')
              : state /* (a kernel's state: the server's word) */
          }
        </span>
      </Line>
      <Line>
        <Field>{`${s.owner ?? trans.__('unknown')} · ${s.mode}`}</Field>
        <Field>{trans.__('%1 queued', s.queue_depth)}</Field>
        <Field>{trans.__('active %1', when(trans, s.last_used))}</Field>
      </Line>
      <Buttons
        actions={[
          ['interrupt', trans.__('Interrupt')],
          ['stop', trans.__('Stop')]
        ]}
      />
    </li>
  );
}

/** A run in progress: how long it has run (as of `now`), the cell it is at. */
export function runRow(
  trans: TranslationBundle,
  s: ISession,
  now: number
): React.ReactElement {
  return (
    <li
      key={s.name}
      className="jp-AgentActivity-row jp-AgentActivity-run"
      data-run={s.name}
    >
      <Line>
        <strong className="jp-AgentActivity-name">
          {s.notebook ?? trans.__('eval: %1', s.name)}
        </strong>
        <span
          className="jp-AgentActivity-elapsed"
          data-since={s.busy_since || undefined}
        >
          {s.busy_since ? elapsed(trans, s.busy_since, now) : ''}
        </span>
      </Line>
      <Line>
        <Field>{runningCell(trans, s)}</Field>
        <Field>
          {s.queue_depth ? trans.__('%1 queued', s.queue_depth) : ''}
        </Field>
      </Line>
      <Buttons actions={[['interrupt', trans.__('Interrupt')]]} />
    </li>
  );
}

/** A recorded change: Open, Diff, Undo (when undoable), and why its undo or diff was refused. */
export function changeRow(
  trans: TranslationBundle,
  c: IChange,
  problem: string | undefined
): React.ReactElement {
  const cells = changedCells(c);
  const actions: [string, string][] = [
    ['open', trans.__('Open')],
    ['diff', trans.__('Diff')]
  ];
  if (c.undoable) {
    actions.push(['undo', trans.__('Undo')]);
  }
  return (
    <li
      key={c.id}
      className="jp-AgentActivity-row jp-AgentActivity-change"
      data-change-id={c.id}
      title={describeChange(trans, c)}
    >
      <Line>
        <strong className="jp-AgentActivity-name">{c.path}</strong>
        <Field>{`#${c.id}`}</Field>
      </Line>
      <Line>
        <Field>{c.action}</Field>
      </Line>
      <Line>
        <Field>
          {trans.__(
            '%1 via %2',
            c.user ?? trans.__('unknown'),
            c.via ?? trans.__('?')
          )}
        </Field>
        <Field>{when(trans, c.time)}</Field>
      </Line>
      <div className="jp-AgentActivity-cells">
        {cells ? trans.__('cells: %1', cells) : ''}
      </div>
      <Buttons actions={actions} />
      {problem && (
        <div className="jp-AgentActivity-problem" role="alert">
          {problem}
        </div>
      )}
    </li>
  );
}

export function tokenRow(
  trans: TranslationBundle,
  t: IAgentToken
): React.ReactElement {
  return (
    <li
      key={tokenKey(t)}
      className="jp-AgentActivity-row jp-AgentActivity-token"
      data-token={t.name}
      data-status={t.status}
    >
      <Line>
        <strong className="jp-AgentActivity-name">{t.name}</strong>
        <span className={`jp-AgentActivity-state jp-mod-${t.status}`}>
          {t.status /* (the server's word) */}
        </span>
      </Line>
      <Line>
        <Field>{trans.__('scopes: %1', t.scopes.join(', '))}</Field>
        <Field>
          {t.paths.length
            ? trans.__('paths: %1', t.paths.join(', '))
            : trans.__('every file')}
        </Field>
      </Line>
      {t.ask.length > 0 && (
        <Line>
          <Field>{trans.__('asks you before: %1', t.ask.join(', '))}</Field>
        </Line>
      )}
      <Line>
        <Field>
          {t.status === 'revoked' && t.revoked
            ? trans.__('revoked %1', when(trans, t.revoked))
            : t.expires
              ? trans.__('expires %1', new Date(t.expires).toLocaleString())
              : trans.__('never expires')}
        </Field>
        <Field>
          {t.last_used
            ? trans.__('last used %1', when(trans, t.last_used))
            : trans.__('never used')}
        </Field>
      </Line>
      {t.status === 'active' && (
        <Buttons actions={[['revoke', trans.__('Revoke')]]} />
      )}
    </li>
  );
}
