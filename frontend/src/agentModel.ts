/**
 * The tokens the extension's plugins share (index.ts): the model of what the server says (`IAgentModel`),
 * and the two services other plugins use when they are there, the cell marks (`IAgentCellMarks`) and this
 * tab's shared focus (`IAgentFocus`). (Agent tokens, the credentials, are tokens.ts.)
 */
import { Token } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal } from '@lumino/signaling';

import type {
  IAgentEvent,
  IAgentToken,
  IApproval,
  IChange,
  IChangeDetail,
  ICreatedToken,
  IDecision,
  ISession,
  ITokenRequest
} from './api';
import type { CellMarks } from './marks';
import type { FocusSharer } from './share';
import type { ITokenChoices } from './tokens';

/** What the frontend knows from the server's routes and events (`AgentModel`); views render it. */
export interface IAgentModel extends IDisposable {
  /** Anything shown changed. */
  readonly stateChanged: ISignal<IAgentModel, void>;
  /** Every event of the bus (with a schema), as it arrives. */
  readonly event: ISignal<IAgentModel, IAgentEvent>;
  /** A change the ledger recorded, as its event told it. */
  readonly recorded: ISignal<IAgentModel, IChange>;
  /** A notebook may have been written on disk (with its ledger change, when the event is one). */
  readonly written: ISignal<
    IAgentModel,
    { path: string; change: IChange | null }
  >;
  /** The cell a notebook run runs in a notebook (null: none any more). */
  readonly running: ISignal<
    IAgentModel,
    { path: string; cellId: string | null }
  >;
  /** A new request for the person's decision (with its details). */
  readonly asked: ISignal<IAgentModel, IApproval>;
  /** A request left the pending ones (decided, expired, withdrawn, or no longer listed). */
  readonly settled: ISignal<IAgentModel, number>;

  readonly connected: boolean;
  readonly sessions: readonly ISession[];
  readonly changes: readonly IChange[];
  readonly approvals: readonly IApproval[];
  readonly tokens: readonly IAgentToken[];
  readonly tokenLimit: number | null;
  readonly tokensProblem: string;
  readonly tokensEnabled: boolean;
  readonly error: string;
  readonly notice: { text: string; ok: boolean } | null;
  readonly problems: ReadonlyMap<string, string>;
  maxChanges: number;

  session(name: string): ISession | undefined;
  change(id: string): IChange | undefined;
  approval(id: number): IApproval | undefined;
  detail(change: { path: string; id: string }): Promise<IChangeDetail>;

  act(action: () => Promise<string>, problemOf?: string | null): Promise<void>;
  interrupt(session: ISession): Promise<string>;
  stop(session: ISession): Promise<string>;
  undo(change: IChange): Promise<string>;
  decide(approval: IApproval, decision: IDecision): Promise<string>;
  createToken(request: ITokenRequest): Promise<ICreatedToken>;
  revokeToken(name: string): Promise<string>;
  tokenChoices(): Promise<ITokenChoices>;

  loadSessions(): Promise<void>;
  loadChanges(): Promise<void>;
  loadApprovals(): Promise<void>;
  loadTokens(): Promise<void>;
}

/** The model, provided by the plugin `jupyter-agent-tools:plugin` (whose settings it reads). */
export const IAgentModel = new Token<IAgentModel>(
  'jupyter-agent-tools:IAgentModel',
  'What AI agents do in this server, from its routes and events: sessions, changes, requests, tokens.'
);

/** The marks on notebook cells (there when notebooks are). */
export const IAgentCellMarks = new Token<CellMarks>(
  'jupyter-agent-tools:IAgentCellMarks',
  'The marks on the cells of open notebooks that agents changed, run, or wait to change.'
);

/** "Share my focus" of this tab (there when notebooks are). */
export const IAgentFocus = new Token<FocusSharer>(
  'jupyter-agent-tools:IAgentFocus',
  "This tab's focus, shared with agents while the person turns it on."
);
