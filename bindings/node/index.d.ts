/** A model exported by tessera.deploy.export_c, loaded with its weights. */
export class Model {
  readonly name: string;
  /** Shapes of the inputs and outputs, as exported. */
  readonly inputShapes: number[][];
  readonly outputShapes: number[][];
  /** 'float32' (Float32Array) or 'int64' (BigInt64Array) per input. */
  readonly inputDtypes: Array<'float32' | 'int64'>;
  /** 'int64' for integer and bool outputs (an argmax's indices). */
  readonly outputDtypes: Array<'float32' | 'int64'>;
  setNumThreads(n: number): void;
  run(inputs: Array<Float32Array | BigInt64Array>,
      outputs?: Array<Float32Array | BigInt64Array>): Array<Float32Array | BigInt64Array>;
  free(): void;
}

/** Load `lib<name>.so` and its weights file; throws naming the problem on bad weights. */
export function load(libPath: string, weightsPath: string, options?: { name?: string }): Model;
