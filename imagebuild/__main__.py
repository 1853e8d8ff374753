from imagebuild.cli.app import main

raise SystemExit(main())
